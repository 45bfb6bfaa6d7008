"""Runtime interface: an isolated place where a session's harness runs."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from polar_cli.interfaces.base import Component


class Runtime(Component):
    """A runtime backend (local process, Docker, Apptainer, ...)."""

    kind: ClassVar[str] = "runtime"

    @abstractmethod
    async def start(self, spec: Any, context: Any) -> Any:
        """Start one session's isolated environment and return its handle."""
