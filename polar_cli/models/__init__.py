"""Polar's data models (pydantic v2)."""

from polar_cli.models.base import StrictModel, validate_model
from polar_cli.models.completion import Completion, Provider, TokenSource
from polar_cli.models.service import (
    TERMINAL_TASK_STATES,
    TRAINER_CALLBACK,
    GatewayPool,
    InferenceStatus,
    NodeLoad,
    NodeStatus,
    ServiceStatus,
    SessionResultCallback,
    SubmitAnswer,
    TaskStatusCallback,
    TrainerCallback,
)
from polar_cli.models.session import SessionResult, TaskState, TaskStatus
from polar_cli.models.task import (
    AgentSpec,
    BuilderSpec,
    EvaluatorSpec,
    Mount,
    PrepareAction,
    RuntimeSpec,
    SamplingSpec,
    TaskRequest,
)
from polar_cli.models.trace import (
    ChainRole,
    PolicyVersions,
    RewardAssignment,
    TokenLogprob,
    Trace,
    Trajectory,
    TrajectoryStatus,
)

__all__ = [
    "TERMINAL_TASK_STATES",
    "TRAINER_CALLBACK",
    "AgentSpec",
    "BuilderSpec",
    "ChainRole",
    "Completion",
    "EvaluatorSpec",
    "GatewayPool",
    "InferenceStatus",
    "Mount",
    "NodeLoad",
    "NodeStatus",
    "PolicyVersions",
    "PrepareAction",
    "Provider",
    "RewardAssignment",
    "RuntimeSpec",
    "SamplingSpec",
    "ServiceStatus",
    "SessionResult",
    "SessionResultCallback",
    "StrictModel",
    "SubmitAnswer",
    "TaskRequest",
    "TaskState",
    "TaskStatus",
    "TaskStatusCallback",
    "TokenLogprob",
    "TokenSource",
    "Trace",
    "TrainerCallback",
    "Trajectory",
    "TrajectoryStatus",
    "validate_model",
]
