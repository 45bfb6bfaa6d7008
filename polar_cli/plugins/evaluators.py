"""Built-in evaluators: ``session_completion`` and ``test_on_output``."""

from __future__ import annotations

from polar_cli.evaluators import OutputTestEvaluator, SessionCompletionEvaluator
from polar_cli.hookspecs import RegisterEvaluator, hookimpl


@hookimpl
def register_evaluators(register: RegisterEvaluator) -> None:
    register(SessionCompletionEvaluator())
    register(OutputTestEvaluator())
