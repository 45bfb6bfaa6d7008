"""One small abstract base class per plugin category."""

from polar_cli.interfaces.backend import BackendClient, InferenceBackend
from polar_cli.interfaces.base import Component
from polar_cli.interfaces.builder import BuildContext, Builder
from polar_cli.interfaces.dataset import Dataset
from polar_cli.interfaces.evaluator import Evaluator
from polar_cli.interfaces.harness import Harness
from polar_cli.interfaces.runtime import Runtime

__all__ = [
    "BackendClient",
    "BuildContext",
    "Builder",
    "Component",
    "Dataset",
    "Evaluator",
    "Harness",
    "InferenceBackend",
    "Runtime",
]
