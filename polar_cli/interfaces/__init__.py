"""One small abstract base class per plugin category, with the context and handle types each one uses.

Plugins import these from :mod:`polar_cli.api`, which re-exports them with everything else a plugin needs.
"""

from polar_cli.interfaces.backend import BackendClient, InferenceBackend
from polar_cli.interfaces.base import Component, NoOptions
from polar_cli.interfaces.builder import BuildContext, Builder
from polar_cli.interfaces.dataset import Dataset
from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult, Evaluator
from polar_cli.interfaces.harness import (
    Harness,
    HarnessContext,
    HarnessLaunch,
    HarnessRun,
    RoleVerdict,
    json_lines,
    system_prompt,
)
from polar_cli.interfaces.runtime import (
    ExecResult,
    OutputCallback,
    Runtime,
    RuntimeContext,
    RuntimeHandle,
    RuntimeProcess,
    Stream,
)

__all__ = [
    "BackendClient",
    "BuildContext",
    "Builder",
    "Component",
    "Dataset",
    "EvaluationContext",
    "EvaluationResult",
    "Evaluator",
    "ExecResult",
    "Harness",
    "HarnessContext",
    "HarnessLaunch",
    "HarnessRun",
    "InferenceBackend",
    "NoOptions",
    "OutputCallback",
    "RoleVerdict",
    "Runtime",
    "RuntimeContext",
    "RuntimeHandle",
    "RuntimeProcess",
    "Stream",
    "json_lines",
    "system_prompt",
]
