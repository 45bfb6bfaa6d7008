"""Reward shaping in real sessions: a task declaring ``evaluator.shaping`` on a real ``polar serve`` (scripted
backend, the shell agent of tests/support/planned.py playing one plan per session). The reward the server records
is the shaped one, the evaluator's is kept beside it, ``groups()`` takes the timeout and error sessions with their
fixed rewards, and the adapters hand the shaped rewards (and advantages from them) to the trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_cli.client import PolarClient
from polar_cli.groups import GroupStats
from polar_cli.models import TaskRequest
from polar_cli.trainers import AdvantageConfig, dr_grpo, slime_groups, verl_outputs
from tests.client.conftest import Served
from tests.support.planned import planned

BUDGET = 1000  # with cache = budget the penalty is linear from the first token: -sampled / BUDGET


def shaped_task(tmp_path: Path) -> TaskRequest:
    data = planned("shaped", ["pass", "fail", "crash", "hang"], tmp_path).model_dump(mode="json")
    data["agent"]["timeout_seconds"] = 15  # the hanging session times out; the others end well before
    data["evaluator"]["shaping"] = {"timeout": -0.2, "error": -0.5, "overlong": {"budget": BUDGET, "cache": BUDGET}}
    return TaskRequest.model_validate(data)


def test_the_recorded_reward_is_the_shaped_one_and_groups_train_on_it(served: Served, tmp_path: Path) -> None:
    stats = GroupStats()
    with PolarClient(served.url, served.token) as client:
        [group] = client.groups([shaped_task(tmp_path)], stats=stats, poll_interval=0.2)
        stored = {r.sample_index: r for r in client.status("shaped").results}
    by_index = {r.sample_index: r for r in group.results}
    assert sorted(by_index) == [0, 1, 2, 3] and group.dropped == []  # timeout and error sessions are usable
    assert [by_index[i].status for i in range(4)] == ["completed", "completed", "error", "timeout"]
    sampled = [sum(len(t.response_ids) for t in by_index[i].trajectory.traces) for i in range(4)]
    assert all(n > 0 for n in sampled)
    overlong = [-sampled[0] / BUDGET, -sampled[1] / BUDGET]
    expected = [  # (evaluator's reward, shaped reward, ending, overlong penalty)
        (1.0, 1.0 + overlong[0], None, overlong[0]),
        (0.0, overlong[1], None, overlong[1]),
        (0.0, -0.5, "error", 0.0),
        (0.0, -0.2, "timeout", 0.0),
    ]
    for i, (evaluator, reward, ending, penalty) in enumerate(expected):
        result = by_index[i]
        shaped = result.shaping
        assert shaped is not None, (i, result.error)
        assert (shaped.evaluator_reward, shaped.ending, shaped.sampled_tokens) == (evaluator, ending, sampled[i])
        assert shaped.reward == pytest.approx(reward) and shaped.overlong_penalty == pytest.approx(penalty)
        assert result.reward == shaped.reward and result.trajectory.reward == shaped.reward
        assert all(t.reward == shaped.reward for t in result.trajectory.traces if t.trainable)
        assert stored[i].reward == result.reward and stored[i].shaping == shaped  # as the server keeps it
    assert group.rewards == [by_index[i].reward for i in range(4)]
    assert stats.rewards.mean == pytest.approx(sum(group.rewards) / 4)  # the statistics see the shaped rewards

    slime = [s for g in slime_groups([group]) for s in g]
    assert [(s.status, s.reward) for s in slime] == [
        ("COMPLETED", group.rewards[0]), ("COMPLETED", group.rewards[1]), ("FAILED", -0.5), ("ABORTED", -0.2)
    ]  # fmt: skip
    outputs = verl_outputs([group], advantages=AdvantageConfig(estimator="dr_grpo"))
    assert [o.extra_fields["polar"]["advantage"] for o in outputs] == pytest.approx(dr_grpo(group.rewards).tolist())
    assert outputs[2].response_mask == [0] * len(outputs[2].response_mask)  # FAILED: in the baseline, not trained
