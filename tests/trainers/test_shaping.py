"""Reward shaping (polar_cli/trainers/shaping.py, ``evaluator.shaping``): DAPO's soft overlong punishment, the fixed
rewards of timeout / limit / error endings, the shaping of a trajectory's traces, the task model, and which shaped
sessions ``groups()`` takes. tests/client/test_reward_shaping.py runs it in real sessions of a real ``polar serve``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from polar_cli.groups import Group, GroupConfig, judge_group
from polar_cli.models import RewardShaping, ShapedReward, TaskRequest, Trajectory
from polar_cli.trainers import overlong_penalty, shape_reward, shape_trajectory
from tests.trainers.helpers import make_result, make_trace


def test_dapos_soft_overlong_punishment_on_hand_computed_lengths() -> None:
    # L_max 100, L_cache 20: free up to 80, linear to -1 at 100, -1 past it
    assert [overlong_penalty(n, 100, 20) for n in (0, 80, 81, 90, 99, 100, 101, 10_000)] == pytest.approx(
        [0.0, 0.0, -0.05, -0.5, -0.95, -1.0, -1.0, -1.0]
    )
    assert overlong_penalty(90, 100, 20, penalty=0.4) == pytest.approx(-0.2)  # scaled
    assert [overlong_penalty(n, 100, 0) for n in (100, 101)] == [0.0, -1.0]  # cache 0: a hard penalty


def test_overlong_penalty_refuses_a_cache_beyond_the_budget() -> None:
    with pytest.raises(ValueError, match="0 <= cache <= budget"):
        overlong_penalty(5, 10, 11)


@given(st.integers(0, 500), st.integers(0, 500), st.integers(1, 500), st.integers(0, 500))
def test_the_penalty_is_between_minus_penalty_and_zero_and_never_shrinks_with_length(
    a: int, b: int, budget: int, cache: int
) -> None:
    cache = min(cache, budget)
    short, long = sorted((a, b))
    assert -1.0 <= overlong_penalty(long, budget, cache) <= overlong_penalty(short, budget, cache) <= 0.0


SHAPING = RewardShaping(timeout=-0.2, limit=-0.3, error=-0.5, overlong={"budget": 100, "cache": 20})


@pytest.mark.parametrize(("status", "fixed"), [("timeout", -0.2), ("limit", -0.3), ("error", -0.5)])
def test_an_abnormal_ending_gets_its_fixed_reward_whatever_the_evaluator_said(status: str, fixed: float) -> None:
    for evaluator in (1.0, 0.0, None):
        shaped = shape_reward(evaluator, status, 500, SHAPING)  # type: ignore[arg-type]
        assert shaped == ShapedReward(evaluator_reward=evaluator, reward=fixed, ending=status, sampled_tokens=500)
        assert shaped.overlong_penalty == 0.0  # the fixed reward is not penalized further


def test_an_ending_without_a_fixed_reward_keeps_the_evaluators_plus_the_overlong_penalty() -> None:
    only_timeout = RewardShaping(timeout=-0.2, overlong={"budget": 100, "cache": 20})
    assert shape_reward(0.0, "error", 90, only_timeout).reward == pytest.approx(-0.5)
    assert shape_reward(1.0, "completed", 90, SHAPING) == ShapedReward(
        evaluator_reward=1.0, reward=0.5, overlong_penalty=-0.5, sampled_tokens=90
    )
    assert shape_reward(1.0, "completed", 80, SHAPING).reward == 1.0
    assert shape_reward(None, "completed", 500, SHAPING).reward is None  # never a reward for an unscored session
    assert shape_reward(0.3, "stale", 10, RewardShaping()).reward == 0.3


def test_shaping_a_trajectory_treats_per_trace_rewards_as_the_session_reward() -> None:
    trajectory = Trajectory(status="completed", traces=[make_trace([1], reward=1.0), make_trace([1], reward=0.25),
                                                        make_trace([1], reward=None)], reward=1.0)  # fmt: skip
    overlong = shape_trajectory(trajectory, shape_reward(1.0, "completed", 90, SHAPING))
    assert overlong.reward == 0.5 and [t.reward for t in overlong.traces] == [0.5, -0.25, None]
    timeout = shape_trajectory(trajectory, shape_reward(1.0, "timeout", 90, SHAPING))
    assert timeout.reward == -0.2 and [t.reward for t in timeout.traces] == [-0.2, -0.2, -0.2]
    assert [t.reward for t in trajectory.traces] == [1.0, 0.25, None]  # pure: the input is unchanged


def test_shaping_is_declared_on_the_tasks_evaluator_and_checked() -> None:
    base = {"instruction": "x", "agent": {"harness": "shell"}}
    task = TaskRequest.model_validate(base | {"evaluator": {"shaping": {"timeout": -0.2, "overlong": {"budget": 8}}}})
    assert task.evaluator.shaping == RewardShaping(timeout=-0.2, overlong={"budget": 8, "cache": 0, "penalty": 1.0})
    with pytest.raises(ValidationError, match="cache \\(9\\) must not exceed budget \\(8\\)"):
        TaskRequest.model_validate(base | {"evaluator": {"shaping": {"overlong": {"budget": 8, "cache": 9}}}})
    with pytest.raises(ValidationError, match="cancelled"):
        TaskRequest.model_validate(base | {"evaluator": {"shaping": {"cancelled": -1}}})
    with pytest.raises(ValidationError, match="timeout"):
        TaskRequest.model_validate(base | {"evaluator": {"shaping": {"timeout": float("nan")}}})


def test_groups_take_an_abnormal_session_only_when_shaping_gave_it_its_endings_reward() -> None:
    task = TaskRequest.model_validate({"task_id": "task-1", "instruction": "x", "num_samples": 3,
                                       "agent": {"harness": "shell"}})  # fmt: skip
    completed = make_result([make_trace([1, 1])], session_id="a", reward=1.0)
    timeout = make_result([make_trace([1, 1], reward=-0.2)], status="timeout", session_id="b", sample_index=1,
                          reward=-0.2)  # fmt: skip
    timeout = timeout.model_copy(update={"shaping": shape_reward(0.0, "timeout", 2, SHAPING)})
    unshaped = make_result([make_trace([1, 1], reward=0.0)], status="error", session_id="c", sample_index=2,
                           reward=0.0)  # fmt: skip
    group = judge_group(task, [completed, timeout, unshaped], GroupConfig())
    assert isinstance(group, Group), group
    assert [r.session_id for r in group.results] == ["a", "b"] and group.rewards == [1.0, -0.2]
    assert [(d.session_id, d.cause) for d in group.dropped] == [("c", "not_completed")]
