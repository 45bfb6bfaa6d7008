"""Harness interface: how one agent CLI is installed, configured and launched."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from polar_cli.interfaces.base import Component


class Harness(Component):
    """An agent harness run unchanged (Codex CLI, Claude Code, pi, a shell command, ...)."""

    kind: ClassVar[str] = "harness"

    @abstractmethod
    def launch(self, context: Any) -> Any:
        """Describe how to start the harness for one session (command, env, files to write)."""
