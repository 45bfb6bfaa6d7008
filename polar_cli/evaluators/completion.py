"""``session_completion``: 1.0 when the harness completed, else 0.0."""

from __future__ import annotations

from typing import ClassVar

from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult, Evaluator


class SessionCompletionEvaluator(Evaluator):
    name: ClassVar[str] = "session_completion"
    description: ClassVar[str] = "1.0 when the harness completed (exit 0, in time), else 0.0"

    async def evaluate(self, context: EvaluationContext) -> EvaluationResult:
        reward = 1.0 if context.status == "completed" else 0.0
        return EvaluationResult(reward=reward, details={"status": context.status})
