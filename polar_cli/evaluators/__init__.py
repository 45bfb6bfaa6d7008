"""Built-in evaluators: ``session_completion`` and ``test_on_output`` (see ``polar_cli.plugins.evaluators``).

Internal: an evaluator plugin takes the test-outcome parsers from :mod:`polar_cli.api`.
"""

from polar_cli.evaluators.completion import SessionCompletionEvaluator
from polar_cli.evaluators.output_tests import OutputTestConfig, OutputTestEvaluator

__all__ = ["OutputTestConfig", "OutputTestEvaluator", "SessionCompletionEvaluator"]
