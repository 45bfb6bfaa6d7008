"""Inference backend interface: where the proxy sends normalized requests."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from polar_cli.interfaces.base import Component


class InferenceBackend(Component):
    """An inference server family (vLLM, SGLang, any OpenAI-compatible server, scripted)."""

    kind: ClassVar[str] = "backend"

    @abstractmethod
    def client(self, **config: Any) -> Any:
        """Create a client that turns a normalized chat request into a generation with token ids."""
