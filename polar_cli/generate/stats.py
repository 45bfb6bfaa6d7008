"""Per-group acceptance and reward statistics (the paper's Table 2, with reward mean / std, zero-variance groups and
pass@k): shared by ``polar generate``'s tables and the dataset card."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from polar_cli.generate.ledger import ResultRow
from polar_cli.models import RewardStats
from polar_cli.rewards import Outcome, reward_stats

TOTAL = "total"


@dataclass
class GroupStats:
    """One group's final results: ``sessions`` (one per task and sample), ``attempts`` (sessions run, retries
    included), ``accepted`` and ``failed`` (error, timeout or cancelled), token and turn counts, and ``rewards``
    (each task's sessions one group; pass@k's correct sessions are the accepted ones)."""

    group: str
    tasks: int = 0
    sessions: int = 0
    attempts: int = 0
    accepted: int = 0
    failed: int = 0
    trainable_tokens: int = 0
    tokens: int = 0
    turns: int = 0
    rewards: RewardStats = field(default_factory=RewardStats)

    @property
    def rate(self) -> float:
        return self.accepted / self.sessions if self.sessions else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns / self.sessions if self.sessions else 0.0


def group_stats(rows: Iterable[ResultRow], by: Mapping[str, str] | None = None) -> list[GroupStats]:
    """One GroupStats per group (sorted by name), then the total. A row's group is ``by[row.task_id]`` (``-`` for a
    task it lacks) when ``by`` is given (e.g. each task's harness), else ``row.group``."""
    groups: dict[str, GroupStats] = {}
    tasks: dict[str, dict[str, list[Outcome]]] = {}
    total = GroupStats(TOTAL)
    all_tasks: dict[str, list[Outcome]] = {}
    for row in rows:
        name = row.group if by is None else by.get(row.task_id, "-")
        if (stats := groups.get(name)) is None:  # not setdefault: a GroupStats (and its RewardStats) per row
            stats = groups[name] = GroupStats(name)
        result = Outcome(reward=row.reward, accepted=row.accepted)
        tasks.setdefault(name, {}).setdefault(row.task_id, []).append(result)
        all_tasks.setdefault(row.task_id, []).append(result)
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
        stats.rewards = reward_stats(tasks[name].values())
    total.tasks = len(all_tasks)
    total.rewards = reward_stats(all_tasks.values())
    return [groups[name] for name in sorted(groups)] + [total]
