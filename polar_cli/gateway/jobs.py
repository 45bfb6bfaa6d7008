"""One session's passage through the pipeline: its stage, budgets, timestamps and what each stage produced."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from polar_cli.models import Completion, SessionResult, TaskRequest, Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from polar_cli.gateway.config import PipelineConfig
    from polar_cli.interfaces.evaluator import EvaluationResult
    from polar_cli.interfaces.runtime import RuntimeHandle


class Stage(StrEnum):
    """Where a session is. ``*_queued`` sessions wait for a worker of the next stage; ``ready`` ones hold a runtime."""

    INIT_QUEUED = "init_queued"
    INIT = "init"
    READY = "ready"
    RUNNING = "running"
    POSTRUN_QUEUED = "postrun_queued"
    POSTRUN = "postrun"
    FINISHING = "finishing"
    FINISHED = "finished"


# (name in SessionResult.stage_seconds, start mark, end mark)
STAGE_SPANS: tuple[tuple[str, str, str], ...] = (
    ("init_wait", "submitted", "init_started"),
    ("init", "init_started", "init_finished"),
    ("ready_wait", "init_finished", "run_started"),
    ("running", "run_started", "run_finished"),
    ("postrun_wait", "run_finished", "postrun_started"),
    ("build", "postrun_started", "build_finished"),
    ("evaluate", "build_finished", "evaluate_finished"),
    ("teardown", "teardown_started", "teardown_finished"),
    ("total", "submitted", "finished"),
)


@dataclass(frozen=True)
class SessionBudget:
    """Seconds each stage may take; ``None`` is unbounded.

    ``agent_seconds`` is the session's one deadline for the harness and all its model calls, counted from the moment
    it gets a run slot (queue waits do not eat agent time). ``evaluation_seconds`` is POSTRUN's separate budget for
    evaluation, so a long agent run cannot starve it.
    """

    agent_seconds: float | None = None
    evaluation_seconds: float | None = None
    init_seconds: float | None = None

    @classmethod
    def for_task(cls, task: TaskRequest, config: PipelineConfig) -> SessionBudget:
        """``timeout_seconds`` (tightened by ``agent.timeout_seconds``) for the agent, ``evaluator.timeout_seconds``
        (else the pipeline default) for evaluation."""
        agent = [s for s in (task.timeout_seconds, task.agent.timeout_seconds) if s is not None]
        evaluation = task.evaluator.timeout_seconds or config.default_evaluation_seconds
        return cls(agent_seconds=min(agent), evaluation_seconds=evaluation, init_seconds=config.init_timeout_seconds)


@dataclass(frozen=True)
class RunOutcome:
    """How RUNNING ended. ``status`` is ``completed``, ``timeout``, ``limit`` or ``error``; ``stderr`` is the
    harness's own."""

    status: TrajectoryStatus
    error: str | None = None
    stderr: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Built:
    """POSTRUN's build step: what the proxy captured and the trajectory the task's builder made of it."""

    trajectory: Trajectory
    completions: list[Completion] = field(default_factory=list)


@dataclass(eq=False)
class SessionResources:
    """What the driver holds for one session between its stages (each set by the stage that makes it)."""

    proxy_key: str | None = None
    """INIT: the secret of the session's proxy session (the harness's API key); set once that session exists."""
    runtime: RuntimeHandle | None = None
    """INIT: the agent's runtime, prepare actions done."""
    prewarm: asyncio.Task[RuntimeHandle] | None = None
    """RUNNING (``refresh_runtime``): the evaluation runtime, starting in the background."""
    fresh: RuntimeHandle | None = None
    """The prewarmed runtime once started (teardown stops it)."""
    captured: list[Completion] | None = None
    """What the proxy session recorded, snapshotted when it was closed (nothing is recorded after that)."""


@dataclass(eq=False)
class SessionJob:
    """One session in the pipeline. ``resources`` is what the driver holds for it between stages."""

    session_id: str
    budget: SessionBudget = field(default_factory=SessionBudget)
    task: TaskRequest | None = None
    task_id: str | None = None
    sample_index: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    """What the session's result (and its traces) record of the task: its metadata without ``script``, and the
    attempt."""
    attempt: int | None = None
    """Which dispatch of the session this is, when the rollout server sent it (1 the first)."""
    resources: SessionResources = field(default_factory=lambda: SessionResources())

    stage: Stage = Stage.INIT_QUEUED
    marks: dict[str, float] = field(default_factory=dict)
    """``time.monotonic()`` of each transition (``submitted``, ``init_started``, ..., ``finished``)."""
    deadline: float | None = None
    """The agent deadline (``time.monotonic()``), set when the session gets a run slot."""
    outcome: RunOutcome | None = None
    completions: list[Completion] | None = None
    """What the proxy captured, once POSTRUN (or a salvage) collected it: kept even when the build then fails."""
    model_requests: int | None = None
    """How many model requests of the harness reached the proxy (recorded or not), set with ``completions``; None
    where the driver cannot tell."""
    built: Built | None = None
    evaluation: EvaluationResult | None = None
    result: SessionResult | None = None
    cancel_reason: str | None = None
    cancel_status: TrajectoryStatus = "cancelled"
    """The status a cancelled session ends with: ``cancelled``, or ``stale`` (see ``StagedPipeline.cancel``)."""
    task_handle: asyncio.Task[Any] | None = field(default=None, repr=False)
    """The stage work running for this session right now (what cancellation interrupts)."""
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        if self.task is not None and self.task_id is None:
            self.task_id = self.task.task_id

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_reason is not None

    def mark(self, name: str) -> float:
        now = time.monotonic()
        self.marks[name] = now
        return now

    def interval(self, start: str, end: str) -> tuple[float, float] | None:
        """The (start, end) monotonic times of a span, if both ends were reached."""
        if start in self.marks and end in self.marks:
            return self.marks[start], self.marks[end]
        return None

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage (and waits between stages) for the spans this session went through."""
        out = {}
        for name, start, end in STAGE_SPANS:
            span = self.interval(start, end)
            if span is not None:
                out[name] = round(max(0.0, span[1] - span[0]), 6)
        return out
