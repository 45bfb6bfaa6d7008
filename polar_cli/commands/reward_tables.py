"""The reward statistics table every command shows (``polar status``, ``polar submit --wait``, ``polar generate``):
one row per task, harness or group, the figures of :class:`~polar_cli.models.RewardStats`."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from polar_cli.models import RewardStats, TaskStatus
from polar_cli.rewards import shown_ks, zero_variance_cell


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def reward_table(title: str, rows: Sequence[tuple[Sequence[str], RewardStats]], labels: Sequence[str],
                 bold_last: bool = False) -> Table:  # fmt: skip
    """``rows``: the label cells (one per ``labels`` column) and the statistics of each row."""
    largest = max((max(s.pass_at_k, default=0) for _, s in rows), default=0)
    ks = shown_ks(largest)
    table = Table(title=title)
    for label in labels:
        table.add_column(label)
    for column in ("sessions", "rewarded", "mean", "std", "zero-variance groups", *(f"pass@{k}" for k in ks)):
        table.add_column(column, justify="right")
    for i, (cells, s) in enumerate(rows):
        table.add_row(*cells, str(s.sessions), str(s.rewarded), _number(s.mean), _number(s.std),
                      zero_variance_cell(s), *(_number(s.pass_at_k.get(k)) for k in ks),
                      style="bold" if bold_last and i == len(rows) - 1 else "")  # fmt: skip
    return table


def task_reward_table(status: TaskStatus) -> Table | None:
    """The task's reward statistics (its finished sessions are one group), when the server sent them."""
    if status.rewards is None:
        return None
    return reward_table(f"rewards of task {status.task_id}",
                        [([status.task_id, status.harness or "-"], status.rewards)], ["task", "harness"])  # fmt: skip
