"""Reward statistics: what a group of sessions (the ``num_samples`` sessions of one task) says about the policy.

One place computes them (:func:`reward_stats`), and every display reads its :class:`RewardStats`: the server's task
status (``polar status TASK``, ``polar submit --wait``), its recent tasks (``polar status``), ``polar generate``'s table
and the dataset card, the TensorBoard writer (:mod:`polar_cli.trainers.tensorboard`).

A session is *accepted* (pass@k's "correct") when it completed, has a trainable token, and its reward is at least a
threshold (1.0 unless ``polar generate --accept-min-reward`` says otherwise): :func:`is_accepted`.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from polar_cli.models import SessionResult
from polar_cli.models.rewards import HarnessRewards, RecentRewards, RewardStats, TaskRewards

DEFAULT_MIN_REWARD = 1.0
MAX_PASS_COLUMNS = 8
"""Tables show pass@k for every k up to this, else for a selection (:func:`shown_ks`)."""
RECENT_TASKS = 20
"""How many ended tasks ``ServiceStatus.rewards`` shows."""


@dataclass(frozen=True)
class Outcome:
    """What the statistics need of one finished session."""

    reward: float | None
    accepted: bool


COMPACTED_KEY = "polar_compacted"
"""In the metadata of a result retention compacted (its traces dropped): what they held, ``{traces, trainable_tokens}``
(``polar_cli.server.store_retention.compact_result``), so its statistics stay as they were."""


def trainable_tokens(result: SessionResult) -> int:
    """The tokens a trainer learns from (of the traces its reward rule makes trainable; side calls by default not)."""
    compacted = result.metadata.get(COMPACTED_KEY)
    if isinstance(compacted, dict) and not result.trajectory.traces:
        return int(compacted.get("trainable_tokens", 0))
    return sum(trace.trainable_tokens for trace in result.trajectory.traces if trace.trainable)


def is_accepted(result: SessionResult, min_reward: float = DEFAULT_MIN_REWARD) -> bool:
    """Completed, with a trainable token and a reward of at least ``min_reward`` (no reward counts as 0.0)."""
    return result.status == "completed" and (result.reward or 0.0) >= min_reward and trainable_tokens(result) > 0


def outcome(result: SessionResult, min_reward: float = DEFAULT_MIN_REWARD) -> Outcome:
    return Outcome(reward=result.reward, accepted=is_accepted(result, min_reward))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. 2021 for ``c`` correct of ``n`` samples: ``1 - C(n-c, k) / C(n, k)``,
    as the product ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (no factorials: stable for any n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, not n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def reward_stats(groups: Iterable[Sequence[Outcome]]) -> RewardStats:
    """The statistics of ``groups`` (each the finished sessions of one task; an empty group is skipped)."""
    rewards: list[float] = []
    sizes: list[tuple[int, int]] = []  # (n, c) per group
    rewarded_groups = zero_variance = 0  # counted here, not on the model: a pydantic attribute write costs ~1 us
    for group in groups:
        if not group:
            continue
        correct = sum(o.accepted for o in group)
        sizes.append((len(group), correct))
        values = [o.reward for o in group if o.reward is not None]
        if values:
            rewards.extend(values)
            rewarded_groups += 1
            zero_variance += len(set(values)) == 1
    stats = RewardStats(sessions=sum(n for n, _ in sizes), rewarded=len(rewards), accepted=sum(c for _, c in sizes),
                        groups=len(sizes), rewarded_groups=rewarded_groups, zero_variance=zero_variance)  # fmt: skip
    if rewards:
        mean = math.fsum(rewards) / len(rewards)
        stats.mean = mean
        stats.std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
        stats.zero_variance_share = stats.zero_variance / stats.rewarded_groups
    for k in range(1, max((n for n, _ in sizes), default=0) + 1):
        values = [pass_at_k(n, c, k) for n, c in sizes if n >= k]
        stats.pass_at_k[k] = math.fsum(values) / len(values)
    return stats


def task_reward_stats(results: Iterable[SessionResult], min_reward: float = DEFAULT_MIN_REWARD) -> RewardStats:
    """One task's finished sessions as one group."""
    return reward_stats([[outcome(r, min_reward) for r in results]])


def shown_ks(largest: int) -> list[int]:
    """The k of the pass@k columns: every k up to ``MAX_PASS_COLUMNS``, else the powers of two and ``largest``."""
    if largest <= MAX_PASS_COLUMNS:
        return list(range(1, largest + 1))
    ks = [2**i for i in range(largest.bit_length()) if 2**i < largest]
    return [*ks, largest]


def zero_variance_cell(stats: RewardStats) -> str:
    """``1/4 (25%)``: groups whose rewards are all equal, of the groups with a reward."""
    if stats.zero_variance_share is None:
        return "-"
    return f"{stats.zero_variance}/{stats.rewarded_groups} ({stats.zero_variance_share:.0%})"


class RecentTasks:
    """``ServiceStatus.rewards`` from the tasks that ended last: each ended task's outcomes are read once (an ended
    task's results never change) and kept for the next reports. Thread-safe; no I/O."""

    def __init__(self, limit: int = RECENT_TASKS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._tasks: OrderedDict[str, tuple[str | None, list[Outcome]]] = OrderedDict()

    def known(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._tasks

    def add(self, task_id: str, harness: str | None, results: Iterable[SessionResult]) -> None:
        outcomes = [outcome(r) for r in results]
        with self._lock:
            self._tasks[task_id] = (harness, outcomes)
            while len(self._tasks) > 2 * self.limit:  # what the next report may still ask for
                self._tasks.popitem(last=False)

    def report(self, task_ids: Sequence[str]) -> RecentRewards:
        """The statistics of ``task_ids`` (those added; in this order) and of their sessions per harness."""
        with self._lock:
            chosen = [(task_id, *self._tasks[task_id]) for task_id in task_ids if task_id in self._tasks]
        tasks = [TaskRewards(task_id=task_id, harness=harness, stats=reward_stats([outcomes]))
                 for task_id, harness, outcomes in chosen]  # fmt: skip
        by_harness: dict[str, list[list[Outcome]]] = {}
        for _, harness, outcomes in chosen:
            by_harness.setdefault(harness or "-", []).append(outcomes)
        harnesses = [HarnessRewards(harness=name, tasks=len(groups), stats=reward_stats(groups))
                     for name, groups in sorted(by_harness.items())]  # fmt: skip
        return RecentRewards(tasks=tasks, harnesses=harnesses)
