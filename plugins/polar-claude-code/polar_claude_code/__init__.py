"""Polar plugin: the Claude Code harness."""

from __future__ import annotations

from typing import Any

from polar_cli.errors import NotImplementedYetError
from polar_cli.hookspecs import Register, hookimpl
from polar_cli.interfaces import Harness


class ClaudeCodeHarness(Harness):
    """Claude Code (``@anthropic-ai/claude-code``), Anthropic Messages API."""

    name = "claude_code"
    description = "Claude Code (@anthropic-ai/claude-code), Anthropic Messages API"

    def launch(self, context: Any) -> Any:
        raise NotImplementedYetError("harness 'claude_code' (polar-claude-code) is declared but not implemented yet")


@hookimpl
def register_harnesses(register: Register) -> None:
    register(ClaudeCodeHarness())
