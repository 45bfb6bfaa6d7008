"""Evaluator interface: scores a finished session."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from polar_cli.interfaces.base import Component


class Evaluator(Component):
    """An evaluation strategy (``session_completion``, ``test_on_output``, ...)."""

    kind: ClassVar[str] = "evaluator"

    @abstractmethod
    async def evaluate(self, context: Any) -> Any:
        """Score one session."""
