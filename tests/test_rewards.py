"""Reward statistics (polar_cli/rewards.py): pass@k against a table worked out by hand, and a few groups' figures."""

from __future__ import annotations

import math

import pytest

from polar_cli.models import SessionResult, Trace, Trajectory
from polar_cli.rewards import Outcome, RecentTasks, is_accepted, pass_at_k, reward_stats, shown_ks

# n, c, k, pass@k = 1 - C(n-c, k) / C(n, k), worked out by hand
PASS_AT_K = [
    (1, 0, 1, 0.0),
    (1, 1, 1, 1.0),
    (2, 1, 1, 1 / 2),
    (2, 1, 2, 1.0),  # k = n: any correct sample passes
    (4, 0, 1, 0.0),  # c = 0
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),  # c = n
    (4, 4, 4, 1.0),
    (4, 1, 1, 1 / 4),
    (4, 1, 2, 1 - 3 / 6),  # C(3,2) = 3, C(4,2) = 6
    (4, 1, 3, 1 - 1 / 4),  # C(3,3) = 1, C(4,3) = 4
    (4, 1, 4, 1.0),
    (4, 2, 2, 1 - 1 / 6),  # C(2,2) = 1
    (4, 2, 3, 1.0),  # n - c < k
    (5, 2, 2, 1 - 3 / 10),  # C(3,2) = 3, C(5,2) = 10
    (5, 2, 3, 1 - 1 / 10),
    (8, 3, 4, 1 - 5 / 70),  # C(5,4) = 5, C(8,4) = 70
    (10, 1, 5, 1 - 126 / 252),  # C(9,5) = 126, C(10,5) = 252
]


@pytest.mark.parametrize(("n", "c", "k", "expected"), PASS_AT_K)
def test_pass_at_k_matches_the_table(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_stays_finite_where_binomials_overflow_floats() -> None:
    value = pass_at_k(2000, 7, 1000)  # C(2000, 1000) has ~600 digits
    assert 0.99 < value <= 1.0 and math.isfinite(value)
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def out(reward: float | None, accepted: bool | None = None) -> Outcome:
    return Outcome(reward, reward == 1.0 if accepted is None else accepted)


def test_reward_stats_of_groups_of_different_sizes() -> None:
    stats = reward_stats([
        [out(1.0), out(0.0), out(1.0), out(0.0)],  # mixed: n 4, c 2
        [out(1.0), out(1.0)],  # all equal: n 2, c 2
        [out(0.5, accepted=False), out(None)],  # one reward (a single reward is all equal), no correct one
        [],  # skipped
    ])  # fmt: skip
    assert (stats.groups, stats.sessions, stats.rewarded, stats.accepted) == (3, 8, 7, 4)
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5]
    mean = sum(rewards) / 7
    assert stats.mean == pytest.approx(mean)
    assert stats.std == pytest.approx(math.sqrt(sum((r - mean) ** 2 for r in rewards) / 7))
    assert (stats.rewarded_groups, stats.zero_variance) == (3, 2) and stats.zero_variance_share == pytest.approx(2 / 3)
    assert sorted(stats.pass_at_k) == [1, 2, 3, 4]
    assert stats.pass_at_k[1] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert stats.pass_at_k[2] == pytest.approx((1 - 1 / 6 + 1 + 0) / 3)
    assert stats.pass_at_k[3] == pytest.approx(1.0)  # only the group of 4 has n >= 3
    assert stats.pass_at_k[4] == pytest.approx(1.0)


def test_no_sessions_and_no_rewards_have_no_figures() -> None:
    assert reward_stats([]).model_dump() == {
        "sessions": 0, "rewarded": 0, "accepted": 0, "mean": None, "std": None, "groups": 0, "rewarded_groups": 0,
        "zero_variance": 0, "zero_variance_share": None, "pass_at_k": {}}  # fmt: skip
    stats = reward_stats([[out(None), out(None)]])
    assert stats.mean is None and stats.zero_variance_share is None and stats.pass_at_k == {1: 0.0, 2: 0.0}


def result(index: int, reward: float | None, status: str = "completed", mask: list[int] | None = None) -> SessionResult:
    trace = Trace(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1] if mask is None else mask, reward=reward)
    return SessionResult.model_validate({
        "session_id": f"s{index}", "task_id": "t", "sample_index": index, "status": status, "reward": reward,
        "trajectory": Trajectory(status=status, session_id=f"s{index}", traces=[trace]).model_dump()})  # fmt: skip


def test_accepted_sessions_completed_with_a_trainable_token_and_enough_reward() -> None:
    assert is_accepted(result(0, 1.0)) and not is_accepted(result(1, 0.9)) and is_accepted(result(1, 0.9), 0.5)
    assert not is_accepted(result(2, 1.0, status="timeout")) and not is_accepted(result(3, 1.0, mask=[0, 0]))


def test_recent_tasks_per_task_and_per_harness() -> None:
    recent = RecentTasks(limit=2)
    recent.add("a", "pi", [result(0, 1.0), result(1, 0.0)])
    recent.add("b", "pi", [result(0, 1.0), result(1, 1.0)])
    recent.add("c", None, [result(0, 0.0)])
    report = recent.report(["a", "b", "c", "gone"])
    assert [(t.task_id, t.harness, t.stats.mean) for t in report.tasks] == [("a", "pi", 0.5), ("b", "pi", 1.0),
                                                                           ("c", None, 0.0)]  # fmt: skip
    (none, pi) = report.harnesses
    assert (none.harness, none.tasks, pi.harness, pi.tasks) == ("-", 1, "pi", 2)
    assert pi.stats.mean == 0.75 and pi.stats.zero_variance == 1 and pi.stats.pass_at_k == {1: 0.75, 2: 1.0}


def test_shown_ks_keep_tables_narrow() -> None:
    assert shown_ks(0) == [] and shown_ks(4) == [1, 2, 3, 4] and shown_ks(16) == [1, 2, 4, 8, 16]
    assert shown_ks(12) == [1, 2, 4, 8, 12]
