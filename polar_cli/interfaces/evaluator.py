"""Evaluator interface: scores a finished session.

The gateway calls :meth:`Evaluator.evaluate` in POSTRUN, after the trajectory is built, with an
:class:`EvaluationContext`: the session's status (``completed``, ``timeout``, ``error``), what the proxy captured, the
built trajectory, ``EvaluatorSpec.config``, the agent's runtime handle (still running) and, when the task sets
``refresh_runtime``, a fresh runtime started from the same spec while the agent ran. The evaluator returns an
:class:`EvaluationResult`: one outcome reward (broadcast to every trace) and, optionally, one reward per trace.
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from polar_cli.errors import EvaluationError
from polar_cli.interfaces.base import Component

if TYPE_CHECKING:
    from polar_cli.interfaces.runtime import RuntimeHandle
    from polar_cli.models import Completion, TaskRequest, Trajectory, TrajectoryStatus


@dataclass(frozen=True)
class EvaluationContext:
    """What an evaluator may look at for one session."""

    session_id: str
    status: TrajectoryStatus
    """How the harness run ended: ``completed``, ``timeout`` or ``error``."""
    completions: list[Completion]
    trajectory: Trajectory
    config: Mapping[str, Any] = field(default_factory=dict)
    """``EvaluatorSpec.config`` (each evaluator documents and validates its keys)."""
    runtime: RuntimeHandle | None = None
    """The agent's runtime, as the agent left it (``None`` if it is gone)."""
    fresh_runtime: RuntimeHandle | None = None
    """``refresh_runtime``: a clean runtime from the same spec (prepare actions done), prewarmed during RUNNING."""
    deadline: float | None = None
    """``time.monotonic()`` when evaluation must end (``EvaluatorSpec.timeout_seconds``); the gateway enforces it."""
    task: TaskRequest | None = None

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or ``None`` when unbounded."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class EvaluationResult:
    """A score: ``reward`` for the session, optional ``per_trace_rewards`` (one per trace, in order)."""

    reward: float
    per_trace_rewards: list[float] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        values = [self.reward, *(self.per_trace_rewards or [])]
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise EvaluationError(f"rewards must be finite numbers, got {values!r}")

    def apply(self, trajectory: Trajectory) -> Trajectory:
        """A copy of ``trajectory`` with the rewards set: per-trace where given, else the outcome reward."""
        per_trace = self.per_trace_rewards
        if per_trace is not None and len(per_trace) != len(trajectory.traces):
            raise EvaluationError(
                f"evaluator gave {len(per_trace)} per-trace rewards for {len(trajectory.traces)} traces"
            )
        traces = [
            trace.model_copy(update={"reward": float(per_trace[i] if per_trace is not None else self.reward)})
            for i, trace in enumerate(trajectory.traces)
        ]
        return trajectory.model_copy(update={"traces": traces, "reward": float(self.reward)})


class Evaluator(Component):
    """An evaluation strategy (``session_completion``, ``test_on_output``, ...)."""

    kind: ClassVar[str] = "evaluator"

    @abstractmethod
    async def evaluate(self, context: EvaluationContext) -> EvaluationResult:
        """Score one session; raise EvaluationError when it cannot be scored."""
