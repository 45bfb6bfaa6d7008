"""Groups for GRPO (docs/service.md, "Groups for GRPO"): the ``num_samples`` sessions of one task, judged together.

``PolarClient.groups`` / ``AsyncPolarClient.groups`` submit tasks from a source and yield each usable :class:`Group`
once every session of its task has finished. Everything but the sending is here, so the two clients share every
decision: the models (:class:`GroupConfig`, :class:`Group`, :class:`GroupStats`), the rules (:func:`judge_group`,
pure) and :class:`GroupRun`, the state of one ``groups()`` call (what to submit, poll and cancel next).

The rules, for a task whose every session has finished:

1. A session is usable when it completed (or ended timeout, limit or error with the fixed reward the task's
   ``evaluator.shaping`` declares for that ending), has a reward, and has at least one trainable trace
   (``trainable``: its role gets the reward under the task's ``reward_to``) with a trainable token (``loss_mask``
   holds a 1) and a reward. The others are the group's ``dropped`` sessions, each with its cause. A session that
   captured no model call at all is never usable (``no_model_call``); when every session of a task that ran
   (completed, timeout, limit or error) captured none, the harness never reached the proxy, and ``groups()`` raises
   a PolarError naming the task rather than train on nothing.
2. Fewer usable sessions than ``min_usable_fraction`` of ``num_samples``: the group is dropped (``too_few_usable``).
3. ``max_staleness``: the server's policy version when the group is judged minus the oldest version of its usable
   traces is above it: dropped (``stale``).
4. ``dynamic_sampling``: the usable rewards are all equal (no GRPO advantage, as DAPO filters): dropped
   (``all_equal``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from polar_cli.errors import ConfigError, PolarError
from polar_cli.models import (
    TERMINAL_TASK_STATES,
    RewardStats,
    SessionResult,
    StrictModel,
    TaskRequest,
    TaskStatus,
    Trace,
)
from polar_cli.models.task import without_script
from polar_cli.rewards import DEFAULT_MIN_REWARD, Outcome, outcome, reward_stats

SessionCause = Literal["not_completed", "no_model_call", "no_trainable_token", "no_reward"]
GroupDropReason = Literal["too_few_usable", "stale", "all_equal"]
RAN = frozenset({"completed", "timeout", "limit", "error", "no_model_call"})
"""Statuses of a session that ran to its end (not cancelled, not stale)."""


class GroupConfig(StrictModel):
    """How ``groups()`` judges and collects groups."""

    min_usable_fraction: float = Field(
        default=0.6, gt=0, le=1, description="a group needs at least this fraction of num_samples usable (and one)"
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="in policy versions: the server's current version minus the oldest version of the group's usable "
        "traces; above it the group is dropped. None: never",
    )
    dynamic_sampling: bool = Field(default=False, description="drop groups whose usable rewards are all equal (DAPO)")
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="stop after this many usable groups and cancel the tasks still running; a dropped group is "
        "replaced from the source. None: every task of the source",
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="tasks submitted and not yet ended at once. None: batch_size, else the whole source (which must "
        "then be finite). Above batch_size with dynamic sampling, the surplus is what DAPO oversamples",
    )


class DroppedSession(BaseModel):
    """A session of a group that is not a usable sample, and why."""

    session_id: str
    sample_index: int
    cause: SessionCause
    detail: str
    result: SessionResult


class Group(BaseModel):
    """The sessions of one task once all have finished: the usable ones (``results``, ``rewards`` aligned with them)
    and the dropped ones with their cause; ``group_id`` / ``rollout_step`` from the task's metadata."""

    task_id: str
    group_id: str | int | None = None
    rollout_step: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="the task's metadata (without its script)")
    num_samples: int
    results: list[SessionResult] = Field(default_factory=list, description="the usable sessions, in sample order")
    rewards: list[float] = Field(default_factory=list)
    dropped: list[DroppedSession] = Field(default_factory=list)
    oldest_version: int | None = Field(default=None, description="the oldest policy version of the usable traces")
    newest_version: int | None = None
    policy_version: int | None = Field(default=None, description="the server's version when judged (max_staleness)")
    staleness: int | None = Field(default=None, description="policy_version - oldest_version, when both are known")

    @property
    def traces(self) -> list[Trace]:
        """Every trace of the usable sessions, in sample order."""
        return [trace for result in self.results for trace in result.trajectory.traces]

    @property
    def usable_fraction(self) -> float:
        return len(self.results) / self.num_samples

    def outcomes(self, min_reward: float = DEFAULT_MIN_REWARD) -> list[Outcome]:
        """Every finished session of the group, usable and dropped, in sample order: what its reward statistics
        are computed from (``min_reward``: the reward at which a session is accepted)."""
        sessions = [*self.results, *(d.result for d in self.dropped)]
        return [outcome(r, min_reward) for r in sorted(sessions, key=lambda r: (r.sample_index, r.session_id))]


class DroppedGroup(BaseModel):
    """A group ``groups()`` did not yield, and why."""

    reason: GroupDropReason
    detail: str
    group: Group


class GroupStats(BaseModel):
    """What one ``groups()`` call did, updated as it goes (pass a fresh one per call and read it during or after)."""

    submitted: list[str] = Field(default_factory=list, description="task ids, in submission order")
    usable: int = Field(default=0, description="groups judged usable (and yielded, unless the caller stopped)")
    dropped: list[DroppedGroup] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list, description="tasks cancelled while still running")
    unused: list[str] = Field(default_factory=list, description="tasks that ended after batch_size was reached")
    source_exhausted: bool = False
    rewards: RewardStats = Field(
        default_factory=RewardStats,
        description="reward statistics of every group judged so far, usable and dropped (polar_cli.rewards)",
    )

    def dropped_by_reason(self) -> dict[str, int]:
        return dict(Counter(drop.reason for drop in self.dropped))


def captured_nothing(result: SessionResult) -> bool:
    """Whether the session recorded no model call: no completion and no response token."""
    return result.num_completions == 0 and not any(trace.response_ids for trace in result.trajectory.traces)


def session_cause(result: SessionResult) -> tuple[SessionCause, str] | None:
    """Why ``result`` is not a usable sample (its cause and a sentence), or None when it is."""
    if result.status == "no_model_call":
        return "no_model_call", result.error or "not one model call reached the proxy"
    shaped_ending = result.shaping is not None and result.shaping.ending == result.status
    if result.status != "completed" and not shaped_ending:
        detail = f"status {result.status}" + (f": {result.error}" if result.error else "")
        return "not_completed", detail + (" (no model call captured)" if captured_nothing(result) else "")
    if captured_nothing(result):
        return "no_model_call", "completed without a single model call through the proxy"
    traces = result.trajectory.traces
    trainable = [trace for trace in traces if trace.trainable and trace.trainable_tokens]
    if not trainable:
        return "no_trainable_token", f"none of its {len(traces)} traces is trainable with a trainable token"
    if result.reward is None or not any(t.reward is not None for t in trainable):
        return "no_reward", "no reward (the session's or its trainable traces')"
    return None


def _nothing_captured_error(task_id: str, results: Sequence[SessionResult]) -> PolarError:
    statuses = ", ".join(f"{n} {status}" for status, n in Counter(r.status for r in results).items())
    error = next((r.error for r in results if r.error), None)
    return PolarError(
        f"task {task_id}: not one of its {len(results)} sessions captured a model call ({statuses}): the harness "
        "never reached Polar's proxy. It bypassed it (called a model directly, answered from a cache) or its model "
        "base URL is misconfigured (it must use the URL and key Polar hands it, e.g. OPENAI_BASE_URL)"
        + (f"; first error: {error}" if error else "")
    )


def _version_range(results: Sequence[SessionResult]) -> tuple[int | None, int | None]:
    versions = [t.policy_versions for r in results for t in r.trajectory.traces if t.policy_versions is not None]
    if not versions:
        return None, None
    return min(v.oldest for v in versions), max(v.newest for v in versions)


def judge_group(
    task: TaskRequest, results: Sequence[SessionResult], config: GroupConfig, policy_version: int | None = None
) -> Group | DroppedGroup:
    """The group of ``task`` from the results of all its sessions: a Group when usable, else a DroppedGroup saying
    why (the rules of this module's docstring, in order). ``policy_version``: the server's current version, needed
    for ``max_staleness`` (None: not checked). A task none of whose sessions captured a model call: PolarError."""
    ordered = sorted(results, key=lambda r: (r.sample_index, r.session_id))
    ran = [r for r in ordered if r.status in RAN]
    if ran and all(captured_nothing(r) for r in ordered):
        raise _nothing_captured_error(task.task_id, ordered)
    usable: list[SessionResult] = []
    dropped: list[DroppedSession] = []
    for result in ordered:
        why = session_cause(result)
        if why is None:
            usable.append(result)
        else:
            dropped.append(DroppedSession(session_id=result.session_id, sample_index=result.sample_index,
                                          cause=why[0], detail=why[1], result=result))  # fmt: skip
    oldest, newest = _version_range(usable)
    staleness = None if policy_version is None or oldest is None else policy_version - oldest
    metadata = without_script(task.metadata)
    group = Group(
        task_id=task.task_id,
        group_id=metadata.get("group_id"),
        rollout_step=metadata.get("rollout_step"),
        metadata=metadata,
        num_samples=task.num_samples,
        results=usable,
        rewards=[r.reward for r in usable if r.reward is not None],
        dropped=dropped,
        oldest_version=oldest,
        newest_version=newest,
        policy_version=policy_version,
        staleness=staleness,
    )

    def drop(reason: GroupDropReason, detail: str) -> DroppedGroup:
        return DroppedGroup(reason=reason, detail=f"task {task.task_id}: {detail}", group=group)

    needed = max(1, config.min_usable_fraction * task.num_samples - 1e-9)
    if len(usable) < needed:
        causes = ", ".join(f"{n} {cause}" for cause, n in Counter(d.cause for d in dropped).items())
        return drop(
            "too_few_usable",
            f"{len(usable)} of {task.num_samples} sessions usable, below {config.min_usable_fraction:.0%} ({causes})",
        )
    if config.max_staleness is not None and staleness is not None and staleness > config.max_staleness:
        return drop(
            "stale",
            f"sampled from policy version {oldest} on, {staleness} behind the current {policy_version} "
            f"(max_staleness {config.max_staleness})",
        )
    if config.dynamic_sampling and len(set(group.rewards)) == 1:
        return drop("all_equal", f"every usable session has reward {group.rewards[0]} (no advantage to learn from)")
    return group


class GroupRun:
    """The state of one ``groups()`` call, without I/O: which tasks run, which have ended and wait to be judged,
    whether the source is used up and the batch is full. The clients send what it asks for."""

    def __init__(self, config: GroupConfig | None = None, stats: GroupStats | None = None) -> None:
        self.config = config or GroupConfig()
        self.stats = stats if stats is not None else GroupStats()
        self.running: dict[str, TaskRequest] = {}
        self.ended: list[tuple[TaskRequest, TaskStatus]] = []
        self._seen: set[str] = set()
        self._judged: list[list[Outcome]] = []

    @property
    def limit(self) -> int | None:
        """At most this many tasks running at once (None: no bound)."""
        return self.config.max_in_flight or self.config.batch_size

    @property
    def batch_full(self) -> bool:
        return self.config.batch_size is not None and self.stats.usable >= self.config.batch_size

    @property
    def finished(self) -> bool:
        """Nothing more to do: the batch is full, or the source is used up and every task judged."""
        return self.batch_full or (self.stats.source_exhausted and not self.running and not self.ended)

    def wants_task(self) -> bool:
        """Whether to take the next task from the source and submit it now."""
        if self.stats.source_exhausted or self.batch_full:
            return False
        return self.limit is None or len(self.running) < self.limit

    def admit(self, task: TaskRequest) -> TaskRequest:
        """``task`` checked before it is submitted: its id new to this call, its group_id / rollout_step typed."""
        if task.task_id in self._seen:
            raise ConfigError(f"task {task.task_id!r} came twice from the source of groups(): give each its own id")
        group_id, step = task.metadata.get("group_id"), task.metadata.get("rollout_step")
        if group_id is not None and (isinstance(group_id, bool) or not isinstance(group_id, str | int)):
            raise ConfigError(f"task {task.task_id!r}: metadata.group_id must be a string or an integer")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise ConfigError(f"task {task.task_id!r}: metadata.rollout_step must be an integer")
        self._seen.add(task.task_id)
        return task

    def submitted(self, task: TaskRequest) -> None:
        self.running[task.task_id] = task
        self.stats.submitted.append(task.task_id)

    def source_ended(self) -> None:
        self.stats.source_exhausted = True

    def polls(self, hold: float) -> list[tuple[str, float | None]]:
        """The status polls of one round, ``(task_id, hold)``: the first is held up to ``hold`` seconds (the server
        answers early when that task ends), so a round paces itself without a sleep; the others answer at once."""
        return [(task_id, hold if i == 0 else None) for i, task_id in enumerate(self.running)]

    def take(self, status: TaskStatus) -> None:
        """A poll's answer: a task that has ended waits to be judged."""
        if status.state in TERMINAL_TASK_STATES and status.task_id in self.running:
            self.ended.append((self.running.pop(status.task_id), status))

    @property
    def needs_policy_version(self) -> bool:
        """Whether judging the ended tasks needs the server's policy version (``max_staleness``)."""
        return bool(self.ended) and self.config.max_staleness is not None

    def judge(self, policy_version: int | None = None) -> list[Group]:
        """Judge every ended task, in the order they ended: the usable groups (dropped ones go to the stats; those
        past a full batch to ``stats.unused``)."""
        usable = []
        ended, self.ended = self.ended, []
        for task, status in ended:
            if self.batch_full:
                self.stats.unused.append(task.task_id)
                continue
            verdict = judge_group(task, status.results, self.config, policy_version)
            self._judged.append((verdict.group if isinstance(verdict, DroppedGroup) else verdict).outcomes())
            self.stats.rewards = reward_stats(self._judged)
            if isinstance(verdict, DroppedGroup):
                self.stats.dropped.append(verdict)
            else:
                usable.append(verdict)
                self.stats.usable += 1
        return usable

    def stop_running(self) -> list[str]:
        """The tasks still running, to cancel (recorded in the stats, no longer polled)."""
        task_ids = list(self.running)
        self.running.clear()
        self.stats.cancelled.extend(task_ids)
        return task_ids
