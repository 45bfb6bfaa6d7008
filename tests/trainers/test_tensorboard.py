"""polar_cli.trainers.tensorboard: a step's groups written with torch's SummaryWriter and read back from the event
file with TensorBoard's EventAccumulator, names and values."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_cli.groups import DroppedGroup, Group, GroupConfig, GroupStats, ReusedGroup, judge_group
from polar_cli.models import PolicyVersions, SessionResult, TaskRequest, TrajectoryStatus
from polar_cli.trainers.tensorboard import step_scalars, write_step
from tests.trainers.helpers import make_result, make_trace


def task(task_id: str, n: int) -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="x", num_samples=n, agent={"harness": "shell"})


def session(task_id: str, index: int, reward: float | None, status: TrajectoryStatus = "completed",
            version: int = 3) -> SessionResult:  # fmt: skip
    trace = make_trace([1, 1, 0], reward=reward).model_copy(
        update={"policy_versions": PolicyVersions(oldest=version, newest=version, per_completion=[version])}
    )
    return make_result([trace], session_id=f"{task_id}-{index}", sample_index=index, task_id=task_id, reward=reward,
                       status=status)  # fmt: skip


def step() -> tuple[list[Group], GroupStats]:
    """Two usable groups (rewards 1, 0, 1 with one errored session; 1, 0.5, carried over from the previous call)
    and one dropped as all equal (0, 0); one task left for the next call."""
    config = GroupConfig(dynamic_sampling=True, min_usable_fraction=0.5)
    reused = [ReusedGroup(task_id="b", carried=1, staleness=1, kept_running=False)]
    stats = GroupStats(submitted=["a", "c", "d", "e"], cancelled=["d"], carried_in=["b"], reused=reused,
                       carried_out=["e"])  # fmt: skip
    verdicts = [
        judge_group(task("a", 4), [session("a", 0, 1.0), session("a", 1, 0.0), session("a", 2, 1.0, version=1),
                                   session("a", 3, None, status="error")], config, policy_version=4),
        judge_group(task("b", 2), [session("b", 0, 1.0), session("b", 1, 0.5)], config, policy_version=4,
                    carried=1),
        judge_group(task("c", 2), [session("c", 0, 0.0), session("c", 1, 0.0)], config, policy_version=4),
    ]  # fmt: skip
    groups = [v for v in verdicts if isinstance(v, Group)]
    stats.dropped = [v for v in verdicts if isinstance(v, DroppedGroup)]
    stats.usable = len(groups)
    return groups, stats


# every session of the three judged groups: rewards 1, 0, 1, 1, 0.5, 0, 0 (the errored one has none)
REWARDS = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0]
MEAN = sum(REWARDS) / 7
EXPECTED = {
    "polar/rewards/sessions": 8.0,
    "polar/rewards/accepted": 3.0,
    "polar/rewards/mean": MEAN,
    "polar/rewards/std": (sum((r - MEAN) ** 2 for r in REWARDS) / 7) ** 0.5,
    "polar/rewards/zero_variance_share": 1 / 3,
    "polar/rewards/pass@1": (2 / 4 + 1 / 2 + 0) / 3,
    "polar/rewards/pass@2": ((1 - 1 / 6) + 1 + 0) / 3,  # a: n 4, c 2: 1 - C(2,2)/C(4,2)
    "polar/rewards/pass@3": 1.0,  # a alone has 3 sessions or more
    "polar/rewards/pass@4": 1.0,
    "polar/rewards/usable_mean": (1.0 + 0.0 + 1.0 + 1.0 + 0.5) / 5,
    "polar/groups/usable": 2.0,
    "polar/groups/submitted": 4.0,
    "polar/groups/dropped": 1.0,
    "polar/groups/dropped/all_equal": 1.0,
    "polar/groups/cancelled": 1.0,
    "polar/groups/unused": 0.0,
    "polar/groups/reused": 1.0,
    "polar/groups/carried_out": 1.0,
    "polar/sessions/usable": 5.0,
    "polar/sessions/dropped": 1.0,
    "polar/tokens/trainable": 10.0,  # two trainable tokens per usable session
    "polar/staleness/mean": (3 + 1) / 2,  # a's oldest usable trace is from version 1, b's from 3; the server: 4
    "polar/staleness/max": 3.0,
    "polar/policy_version": 4.0,
}


def test_step_scalars_name_the_steps_figures() -> None:
    groups, stats = step()
    assert step_scalars(groups, stats) == pytest.approx(EXPECTED)
    assert "polar/groups/dropped" not in step_scalars(groups)  # without the GroupStats: the usable groups only
    assert step_scalars([], GroupStats()) == {"polar/rewards/sessions": 0.0, "polar/rewards/accepted": 0.0,
        "polar/groups/usable": 0.0, "polar/sessions/usable": 0.0, "polar/sessions/dropped": 0.0,
        "polar/tokens/trainable": 0.0, "polar/groups/submitted": 0.0, "polar/groups/dropped": 0.0,
        "polar/groups/cancelled": 0.0, "polar/groups/unused": 0.0, "polar/groups/reused": 0.0,
        "polar/groups/carried_out": 0.0}  # fmt: skip


def test_write_step_to_an_event_file_and_read_it_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    groups, stats = step()
    writer = SummaryWriter(log_dir=str(tmp_path / "run"))
    written = write_step(writer, 7, groups, stats, extra={"train/loss": 0.25})
    write_step(writer, 8, groups[:1])
    writer.close()
    assert written == pytest.approx({**EXPECTED, "train/loss": 0.25})

    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(written)
    for name, value in written.items():
        points = events.Scalars(name)
        assert points[0].step == 7 and points[0].value == pytest.approx(value, rel=1e-6), name
    assert [(p.step, p.value) for p in events.Scalars("polar/groups/usable")] == [(7, 2.0), (8, 1.0)]
    assert [p.step for p in events.Scalars("polar/groups/dropped")] == [7]  # step 8 wrote no GroupStats
