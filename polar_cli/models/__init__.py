"""Polar's data models (pydantic v2)."""

from polar_cli.models.base import StrictModel, validate_model
from polar_cli.models.completion import Completion, Provider, TokenSource
from polar_cli.models.session import SessionResult, TaskState, TaskStatus
from polar_cli.models.task import (
    AgentSpec,
    BuilderSpec,
    EvaluatorSpec,
    Mount,
    PrepareAction,
    RuntimeSpec,
    TaskRequest,
)
from polar_cli.models.trace import TokenLogprob, Trace, Trajectory, TrajectoryStatus

__all__ = [
    "AgentSpec",
    "BuilderSpec",
    "Completion",
    "EvaluatorSpec",
    "Mount",
    "PrepareAction",
    "Provider",
    "RuntimeSpec",
    "SessionResult",
    "StrictModel",
    "TaskRequest",
    "TaskState",
    "TaskStatus",
    "TokenLogprob",
    "TokenSource",
    "Trace",
    "Trajectory",
    "TrajectoryStatus",
    "validate_model",
]
