"""Polar: agentic RL on any harness."""

from polar_cli.hookspecs import hookimpl
from polar_cli.models import (
    AgentSpec,
    BuilderSpec,
    Completion,
    EvaluatorSpec,
    RuntimeSpec,
    SessionResult,
    TaskRequest,
    TaskStatus,
    Trace,
    Trajectory,
)

__version__ = "0.1.0"

__all__ = [
    "AgentSpec",
    "BuilderSpec",
    "Completion",
    "EvaluatorSpec",
    "RuntimeSpec",
    "SessionResult",
    "TaskRequest",
    "TaskStatus",
    "Trace",
    "Trajectory",
    "__version__",
    "hookimpl",
]
