"""Reward shaping in real sessions: a task declaring ``evaluator.shaping`` on a real ``polar serve`` (scripted
backend, the shell agent of tests/support/planned.py playing one plan per session). The reward the server records
is the shaped one, the evaluator's is kept beside it, ``groups()`` takes the timeout and error sessions with their
fixed rewards, and the adapters hand the shaped rewards (and advantages from them) to the trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_cli.client import PolarClient
from polar_cli.groups import GroupStats
from polar_cli.models import SessionResult, TaskRequest
from polar_cli.trainers import AdvantageConfig, dr_grpo, slime_groups, verl_outputs
from tests.client.conftest import Served
from tests.support.planned import planned

BUDGET = 1000  # with cache = budget the penalty is linear from the first token: -sampled / BUDGET


def shaped_task(tmp_path: Path) -> TaskRequest:
    data = planned("shaped", ["pass", "fail", "crash", "hang"], tmp_path).model_dump(mode="json")
    data["agent"]["timeout_seconds"] = 15  # the hanging session times out; the others end well before
    data["evaluator"]["shaping"] = {"timeout": -0.2, "error": -0.5, "overlong": {"budget": BUDGET, "cache": BUDGET}}
    return TaskRequest.model_validate(data)


def act_of(result: SessionResult) -> str:
    """The plan's act a session played: ``pass`` / ``fail`` (completed; the evaluator gave 1 / 0), else its ending."""
    if result.status != "completed":
        return result.status
    return "pass" if result.shaping is not None and result.shaping.evaluator_reward == 1.0 else "fail"


def test_the_recorded_reward_is_the_shaped_one_and_groups_train_on_it(served: Served, tmp_path: Path) -> None:
    stats = GroupStats()
    with PolarClient(served.url, served.token) as client:
        [group] = client.groups([shaped_task(tmp_path)], stats=stats, poll_interval=0.2)
        stored = {r.session_id: r for r in client.status("shaped").results}
    # sessions claim their plan's act in the order they start, not by sample index: tell them apart by their ending
    by_kind = {act_of(r): r for r in group.results}
    assert sorted(by_kind) == ["error", "fail", "pass", "timeout"] and group.dropped == []  # all four usable
    sampled = {kind: sum(len(t.response_ids) for t in r.trajectory.traces) for kind, r in by_kind.items()}
    assert all(n > 0 for n in sampled.values())
    expected = {  # kind: (evaluator's reward, shaped reward, ending, overlong penalty)
        "pass": (1.0, 1.0 - sampled["pass"] / BUDGET, None, -sampled["pass"] / BUDGET),
        "fail": (0.0, -sampled["fail"] / BUDGET, None, -sampled["fail"] / BUDGET),
        "error": (0.0, -0.5, "error", 0.0),
        "timeout": (0.0, -0.2, "timeout", 0.0),
    }
    for kind, (evaluator, reward, ending, penalty) in expected.items():
        result = by_kind[kind]
        shaped = result.shaping
        assert shaped is not None, (kind, result.error)
        assert (shaped.evaluator_reward, shaped.ending, shaped.sampled_tokens) == (evaluator, ending, sampled[kind])
        assert shaped.reward == pytest.approx(reward) and shaped.overlong_penalty == pytest.approx(penalty)
        assert result.reward == shaped.reward and result.trajectory.reward == shaped.reward
        assert all(t.reward == shaped.reward for t in result.trajectory.traces if t.trainable)
        stored_result = stored[result.session_id]
        assert stored_result.reward == result.reward and stored_result.shaping == shaped  # as the server keeps it
    assert group.rewards == [r.reward for r in group.results]
    assert stats.rewards.mean == pytest.approx(sum(group.rewards) / 4)  # the statistics see the shaped rewards

    slime = [s for g in slime_groups([group]) for s in g]
    assert [(s.status, s.reward) for s in slime] == [
        ({"completed": "COMPLETED", "error": "FAILED", "timeout": "ABORTED"}[r.status], r.reward) for r in group.results
    ]
    outputs = verl_outputs([group], advantages=AdvantageConfig(estimator="dr_grpo"))
    assert [o.extra_fields["polar"]["advantage"] for o in outputs] == pytest.approx(dr_grpo(group.rewards).tolist())
    failed = [o for o, r in zip(outputs, group.results, strict=True) if r.status == "error"]
    assert [o.response_mask == [0] * len(o.response_mask) for o in failed] == [True]  # in the baseline, not trained
