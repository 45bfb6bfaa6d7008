"""Polar plugin: the Codex CLI harness."""

from __future__ import annotations

from typing import Any

from polar_cli.errors import NotImplementedYetError
from polar_cli.hookspecs import Register, hookimpl
from polar_cli.interfaces import Harness


class CodexHarness(Harness):
    """OpenAI Codex CLI (``@openai/codex``), OpenAI Responses API."""

    name = "codex"
    description = "OpenAI Codex CLI (@openai/codex), Responses API"

    def launch(self, context: Any) -> Any:
        raise NotImplementedYetError("harness 'codex' (polar-codex) is declared but not implemented yet")


@hookimpl
def register_harnesses(register: Register) -> None:
    register(CodexHarness())
