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

Reuse across calls (efficient DAPO): a :class:`ReuseBuffer` passed to each call keeps what a call with ``batch_size``
leaves over, its surplus: the tasks that ended after the batch was full (and, with ``GroupConfig.keep_running``, the
ones still running). The next call takes it all at its start and judges the ended ones first, under its own config and
against the server's version then, so a surplus group comes out first, or is dropped ``stale`` past ``max_staleness``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Self

from pydantic import BaseModel, Field, model_validator

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
    keep_running: bool = Field(
        default=False,
        description="with batch_size and a ReuseBuffer: once the batch is full, the tasks still running are left "
        "running and carried to the next call in the buffer, not cancelled. Off by default: they go on sampling "
        "through the trainer's weight update (what they sampled before it is then a version behind) and hold the "
        "server's capacity until the next call, or until the trainer cancels them (ReuseBuffer.discard)",
    )

    @model_validator(mode="after")
    def _keep_running_needs_a_batch(self) -> Self:
        if self.keep_running and self.batch_size is None:
            raise ValueError("keep_running keeps the tasks still running once the batch is full: set batch_size")
        return self


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
    policy_version: int | None = Field(
        default=None,
        description="the server's version when judged (asked with max_staleness, or when carried groups are judged)",
    )
    staleness: int | None = Field(default=None, description="policy_version - oldest_version, when both are known")
    carried: int = Field(
        default=0, description="groups() calls its task was carried over in a ReuseBuffer (0: this call's own task)"
    )

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


class ReusedGroup(BaseModel):
    """A usable group whose task an earlier ``groups()`` call submitted, handed out by this one."""

    task_id: str
    carried: int = Field(description="calls its task was carried over (1: submitted by the previous call)")
    staleness: int | None = Field(description="versions behind the server's when handed out (Group.staleness)")
    kept_running: bool = Field(description="its task ran on past a full batch (GroupConfig.keep_running)")


class GroupStats(BaseModel):
    """What one ``groups()`` call did, updated as it goes (pass a fresh one per call and read it during or after)."""

    submitted: list[str] = Field(default_factory=list, description="task ids, in submission order")
    usable: int = Field(default=0, description="groups judged usable (and yielded, unless the caller stopped)")
    dropped: list[DroppedGroup] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list, description="tasks cancelled while still running")
    unused: list[str] = Field(
        default_factory=list, description="tasks that ended after batch_size was reached (without a ReuseBuffer)"
    )
    carried_in: list[str] = Field(
        default_factory=list, description="tasks of earlier calls taken from the ReuseBuffer: ended, then running"
    )
    reused: list[ReusedGroup] = Field(
        default_factory=list, description="usable groups of carried tasks handed out, in order (the rest: dropped)"
    )
    carried_out: list[str] = Field(
        default_factory=list,
        description="tasks left in the ReuseBuffer for the next call: ended after the batch was full, still running "
        "(keep_running), or ended and not handed out when the loop was left early",
    )
    source_exhausted: bool = False
    rewards: RewardStats = Field(
        default_factory=RewardStats,
        description="reward statistics of every group judged so far, usable and dropped (polar_cli.rewards)",
    )

    def dropped_by_reason(self) -> dict[str, int]:
        return dict(Counter(drop.reason for drop in self.dropped))


class CarriedTask(BaseModel):
    """A task an earlier ``groups()`` call left in a :class:`ReuseBuffer`."""

    task: TaskRequest
    status: TaskStatus | None = Field(default=None, description="its final status once ended; None: still running")
    carried: int = Field(default=1, ge=1, description="calls it has been carried over")
    kept_running: bool = Field(default=False, description="it ran on past a full batch (GroupConfig.keep_running)")


class ReuseBuffer(BaseModel):
    """What one ``groups()`` call leaves to the next (the trainer keeps one and passes it to every call): its surplus
    tasks that ended after the batch was full, in the order they ended, and, with ``GroupConfig.keep_running``, those
    still running. A call takes all of it when it starts and puts back what it leaves, so nothing is handed out
    twice. A pydantic model: it can be saved with a checkpoint."""

    ended: list[CarriedTask] = Field(default_factory=list)
    running: list[CarriedTask] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ended) + len(self.running)

    def discard(self) -> list[str]:
        """Empty the buffer; the ids of its tasks still running, for the caller to cancel (``client.cancel``)."""
        task_ids = [carried.task.task_id for carried in self.running]
        self.ended, self.running = [], []
        return task_ids


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
    task: TaskRequest,
    results: Sequence[SessionResult],
    config: GroupConfig,
    policy_version: int | None = None,
    carried: int = 0,
) -> Group | DroppedGroup:
    """The group of ``task`` from the results of all its sessions: a Group when usable, else a DroppedGroup saying
    why (the rules of this module's docstring, in order). ``policy_version``: the server's current version, needed
    for ``max_staleness`` (None: not checked); ``carried``: the group's ``carried``. A task none of whose sessions
    captured a model call: PolarError."""
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
        carried=carried,
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
    which usable groups wait to be handed out, whether the source is used up and the batch is full. The clients send
    what it asks for. With ``reuse`` it starts from what the buffer holds (the ended tasks to judge first, the
    running ones to poll) and leaves its own surplus there."""

    def __init__(
        self, config: GroupConfig | None = None, stats: GroupStats | None = None, reuse: ReuseBuffer | None = None
    ) -> None:
        self.config = config or GroupConfig()
        self.stats = stats if stats is not None else GroupStats()
        if self.config.keep_running and reuse is None:
            raise ConfigError(
                "GroupConfig.keep_running carries the tasks still running to the next groups() call in a reuse "
                "buffer: pass reuse=ReuseBuffer(), the same one to every call"
            )
        self.reuse = reuse
        self.running: dict[str, TaskRequest] = {}
        self.ended: deque[tuple[TaskRequest, TaskStatus]] = deque()
        self.ready: deque[tuple[Group, TaskRequest, TaskStatus]] = deque()
        self._seen: set[str] = set()
        self._judged: list[list[Outcome]] = []
        self._carried: dict[str, int] = {}
        self._kept_running: set[str] = set()
        self._cancelling: dict[str, TaskRequest] = {}
        if reuse is not None:
            self._take_over(reuse)

    def _take_over(self, reuse: ReuseBuffer) -> None:
        """Everything ``reuse`` holds becomes this call's: the ended tasks first to judge, the running ones polled."""
        ended, running = reuse.ended, reuse.running
        reuse.ended, reuse.running = [], []
        for carried in [*ended, *running]:
            task_id = carried.task.task_id
            self._carried[task_id] = carried.carried
            self._seen.add(task_id)
            self.stats.carried_in.append(task_id)
            if carried.kept_running or carried.status is None:
                self._kept_running.add(task_id)
            if carried.status is None:
                self.running[task_id] = carried.task
            else:
                self.ended.append((carried.task, carried.status))

    def _carry(self, task: TaskRequest, status: TaskStatus | None, *, first: bool = False) -> None:
        """``task`` left in the reuse buffer for the next call (``first``: ahead of the ones this call left)."""
        assert self.reuse is not None
        kept_running = status is None or task.task_id in self._kept_running
        carried = CarriedTask(task=task, status=status, carried=self._carried.get(task.task_id, 0) + 1,
                              kept_running=kept_running)  # fmt: skip
        if status is None:
            self.reuse.running.append(carried)
        elif first:
            self.reuse.ended.insert(0, carried)
        else:
            self.reuse.ended.append(carried)
        self.stats.carried_out.append(task.task_id)

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
        if task.task_id in self._carried:
            raise ConfigError(f"task {task.task_id!r} came from the source of groups() and from its reuse buffer "
                              "(an earlier call submitted it): give each task its own id")  # fmt: skip
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
        """Whether judging the ended tasks needs the server's policy version (``max_staleness``, or a carried task's
        staleness for the stats)."""
        if not self.ended:
            return False
        return self.config.max_staleness is not None or any(task.task_id in self._carried for task, _ in self.ended)

    def judge(self, policy_version: int | None = None) -> list[Group]:
        """Judge every ended task, in the order they ended: the usable groups, which also wait in ``ready`` to be
        handed out (dropped ones go to the stats; those past a full batch to the reuse buffer, else
        ``stats.unused``). A task judged raising a PolarError leaves the others to judge."""
        usable = []
        while self.ended:
            task, status = self.ended.popleft()
            if self.batch_full:
                self._surplus(task, status)
                continue
            carried = self._carried.get(task.task_id, 0)
            verdict = judge_group(task, status.results, self.config, policy_version, carried)
            self._judged.append((verdict.group if isinstance(verdict, DroppedGroup) else verdict).outcomes())
            self.stats.rewards = reward_stats(self._judged)
            if isinstance(verdict, DroppedGroup):
                self.stats.dropped.append(verdict)
            else:
                usable.append(verdict)
                self.ready.append((verdict, task, status))
                self.stats.usable += 1
        return usable

    def hand_out(self) -> Iterator[Group]:
        """The usable groups judged and not handed out yet, each once (taken off ``ready`` before it is yielded)."""
        while self.ready:
            group, task, _ = self.ready.popleft()
            if group.carried:
                self.stats.reused.append(ReusedGroup(task_id=task.task_id, carried=group.carried,
                                                     staleness=group.staleness,
                                                     kept_running=task.task_id in self._kept_running))  # fmt: skip
            yield group

    def _surplus(self, task: TaskRequest, status: TaskStatus) -> None:
        if self.reuse is not None:
            self._carry(task, status)
        else:
            self.stats.unused.append(task.task_id)

    def stop_running(self) -> list[str]:
        """The tasks still running, to cancel (recorded in the stats, no longer polled)."""
        task_ids = list(self.running)
        self._cancelling.update(self.running)
        self.running.clear()
        self.stats.cancelled.extend(task_ids)
        return task_ids

    def stop_surplus(self) -> list[str]:
        """Once the batch is full: the tasks still running to cancel, or none with ``keep_running`` (they go to the
        reuse buffer, running)."""
        if not self.config.keep_running:
            return self.stop_running()
        for task in self.running.values():
            self._carry(task, None)
        self.running.clear()
        return []

    def cancelled(self, status: TaskStatus) -> None:
        """A cancel's answer. With a reuse buffer, a task that had ended before the cancel reached it (completed or
        failed: not cancelled) is not lost: it is surplus, carried like one that ended after the batch was full."""
        task = self._cancelling.pop(status.task_id, None)
        if task is None or self.reuse is None or status.state not in TERMINAL_TASK_STATES - {"cancelled"}:
            return
        self.stats.cancelled.remove(status.task_id)
        self._carry(task, status)

    def close(self) -> None:
        """At the end of the call: with a reuse buffer, the groups judged and not handed out (the loop was left
        early) and the tasks ended and not judged go back to it, ahead of the surplus, to come out first next time."""
        if self.reuse is None:
            return
        for task, status in reversed([(task, status) for _, task, status in self.ready] + list(self.ended)):
            self._carry(task, status, first=True)
        self.ready.clear()
        self.ended.clear()
