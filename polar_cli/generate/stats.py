"""Per-group acceptance statistics (the paper's Table 2): shared by ``polar generate``'s table and the dataset card."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from polar_cli.generate.ledger import ResultRow

TOTAL = "total"


@dataclass
class GroupStats:
    """One group's final results: ``sessions`` (one per task and sample), ``attempts`` (sessions run, retries
    included), ``accepted`` and ``failed`` (error, timeout or cancelled), and token and turn counts."""

    group: str
    tasks: int = 0
    sessions: int = 0
    attempts: int = 0
    accepted: int = 0
    failed: int = 0
    trainable_tokens: int = 0
    tokens: int = 0
    turns: int = 0

    @property
    def rate(self) -> float:
        return self.accepted / self.sessions if self.sessions else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns / self.sessions if self.sessions else 0.0


def group_stats(rows: Iterable[ResultRow]) -> list[GroupStats]:
    """One GroupStats per group (sorted by name), then the total."""
    groups: dict[str, GroupStats] = {}
    tasks: dict[str, set[str]] = {}
    total = GroupStats(TOTAL)
    all_tasks: set[str] = set()
    for row in rows:
        stats = groups.setdefault(row.group, GroupStats(row.group))
        tasks.setdefault(row.group, set()).add(row.task_id)
        all_tasks.add(row.task_id)
        for target in (stats, total):
            target.sessions += 1
            target.attempts += row.attempts
            target.accepted += row.accepted
            target.failed += row.status != "completed"
            target.trainable_tokens += row.trainable_tokens
            target.tokens += row.tokens
            target.turns += row.turns
    for name, stats in groups.items():
        stats.tasks = len(tasks[name])
    total.tasks = len(all_tasks)
    return [groups[name] for name in sorted(groups)] + [total]
