"""Polar: agentic RL on any harness.

The declared plugin surface is :mod:`polar_cli.api`: a plugin package imports it and nothing else. This root
re-exports ``hookimpl`` and the public models; every other module is internal and may change without notice.
"""

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
