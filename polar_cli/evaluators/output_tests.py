"""``test_on_output``: run the task's test command in the session's runtime and score from its result.

Scoring (``EvaluatorSpec.config``, see :class:`OutputTestConfig`):

- without ``expected_pass``: 1.0 when the command exits with one of ``pass_exit_codes`` (default ``[0]``) in time,
  else 0.0;
- with ``expected_pass``: the test outcomes are parsed (pytest ``-rA``/``-v`` lines in stdout+stderr, or the JUnit XML
  report at ``results_file``); ``scoring: all`` (default) gives 1.0 only when every expected test passed, ``fraction``
  gives the fraction that passed. The exit code is ignored then (pytest exits 1 when any other test fails).

A command that runs out of time scores 0.0. With ``refresh_runtime`` the command runs in the fresh runtime after the
agent's patch is applied: ``patch_command`` runs in the agent's runtime (in ``cwd``; its stdout is the patch; it sees
``POLAR_BASE_COMMIT``, the fresh runtime's ``HEAD``; the default diffs from it when the agent's repository has it,
so commits the agent made are included, and includes untracked files) and the patch is applied
in the fresh runtime with ``git apply``. A patch that does not apply scores 0.0 (``details.patch_error``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from polar_cli.errors import EvaluationError, PolarError
from polar_cli.evaluators.outcomes import parse_junit_xml, parse_pytest_output
from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult, Evaluator
from polar_cli.interfaces.runtime import ExecResult, RuntimeHandle
from polar_cli.models import StrictModel

# The diff from the fresh runtime's HEAD when the agent's repo has that commit (so the agent's own commits are in the
# patch), else from the agent's HEAD; untracked files are included (`git add -A`).
DEFAULT_PATCH_COMMAND = (
    'git add -A >/dev/null && base=HEAD && if [ -n "$POLAR_BASE_COMMIT" ] && '
    'git cat-file -e "$POLAR_BASE_COMMIT^{commit}" 2>/dev/null; then base="$POLAR_BASE_COMMIT"; fi && '
    'git diff --cached --binary "$base"'
)
TAIL = 4000  # characters of output kept in details
LIST_LIMIT = 200  # test ids kept per list in details


class OutputTestConfig(StrictModel):
    """``EvaluatorSpec.config`` of ``test_on_output``."""

    command: str | list[str] = Field(description="argv list, or a string run as `bash -lc STRING`")
    cwd: str | None = Field(default=None, description="where the command runs (default: the runtime's workdir)")
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float | None = Field(default=None, gt=0, description="default: what is left of the eval budget")
    pass_exit_codes: list[int] = Field(default_factory=lambda: [0])
    expected_pass: list[str] | None = Field(default=None, description="test ids that must pass")
    scoring: Literal["all", "fraction"] = "all"
    results_file: str | None = Field(default=None, description="JUnit XML report the command writes (runtime path)")
    patch_command: str = Field(default=DEFAULT_PATCH_COMMAND, description="refresh_runtime: prints the agent's patch")

    def argv(self) -> list[str]:
        if isinstance(self.command, str):
            return ["bash", "-lc", self.command]
        return list(self.command)


def _tail(text: str) -> str:
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def _timeout(config: OutputTestConfig, context: EvaluationContext) -> float | None:
    left = context.remaining()
    if config.timeout_seconds is None:
        return left
    return config.timeout_seconds if left is None else min(config.timeout_seconds, left)


async def _exec(handle: RuntimeHandle, argv: list[str], **kwargs: Any) -> ExecResult:
    try:
        return await handle.exec(argv, **kwargs)
    except PolarError as exc:
        raise EvaluationError(f"test_on_output: {exc}") from exc


async def transfer_patch(
    agent: RuntimeHandle, fresh: RuntimeHandle, config: OutputTestConfig, timeout: float | None
) -> str | None:
    """Apply the agent's changes to ``fresh``; returns why the patch did not apply, or None."""
    head = await _exec(fresh, ["git", "rev-parse", "HEAD"], cwd=config.cwd, timeout=timeout)
    env = {**config.env, "POLAR_BASE_COMMIT": head.stdout.strip()} if head.ok else dict(config.env)
    made = await _exec(agent, ["bash", "-lc", config.patch_command], cwd=config.cwd, env=env, timeout=timeout)
    if not made.ok:
        raise EvaluationError(f"test_on_output: patch_command failed ({made.exit_code}): {_tail(made.stderr)}")
    if not made.stdout.strip():
        return None  # the agent changed nothing
    applied = await _exec(
        fresh,
        ["git", "apply", "--whitespace=nowarn", "-"],
        cwd=config.cwd,
        stdin=made.stdout.encode(),
        timeout=timeout,
    )
    if not applied.ok:
        return f"git apply failed ({applied.exit_code}): {_tail(applied.stderr or applied.stdout)}"
    return None


async def _read_report(handle: RuntimeHandle, remote: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="polar-eval-") as tmp:
        local = Path(tmp) / "report.xml"
        try:
            await handle.download(remote, local)
        except PolarError as exc:
            raise EvaluationError(f"test_on_output: cannot read results_file {remote}: {exc}") from exc
        return local.read_bytes()


def score(config: OutputTestConfig, outcomes: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """The reward for ``expected_pass`` against parsed ``outcomes``, with what passed and what did not."""
    expected = list(dict.fromkeys(config.expected_pass or []))
    passed = [t for t in expected if outcomes.get(t) == "PASSED"]
    missing = [t for t in expected if outcomes.get(t) != "PASSED"]
    if not expected:
        reward = 1.0
    elif config.scoring == "fraction":
        reward = len(passed) / len(expected)
    else:
        reward = 1.0 if not missing else 0.0
    details = {
        "expected": len(expected),
        "passed_expected": len(passed),
        "not_passed": {t: outcomes.get(t, "MISSING") for t in missing[:LIST_LIMIT]},
        "tests_seen": len(outcomes),
    }
    return reward, details


class OutputTestEvaluator(Evaluator):
    name: ClassVar[str] = "test_on_output"
    description: ClassVar[str] = "run the task's test command in the runtime; score by exit code or expected tests"

    options: ClassVar[type[BaseModel]] = OutputTestConfig

    async def evaluate(self, context: EvaluationContext) -> EvaluationResult:
        config: OutputTestConfig = self.parse_config(context.config)
        details: dict[str, Any] = {"refreshed": context.fresh_runtime is not None}
        if context.fresh_runtime is not None:
            if context.runtime is None:
                raise EvaluationError("test_on_output: refresh_runtime needs the agent's runtime to take its patch")
            problem = await transfer_patch(context.runtime, context.fresh_runtime, config, _timeout(config, context))
            if problem is not None:
                return EvaluationResult(reward=0.0, details={**details, "patch_error": problem})
            target = context.fresh_runtime
        elif context.runtime is not None:
            target = context.runtime
        else:
            raise EvaluationError("test_on_output: the session has no runtime to run the tests in")

        result = await _exec(target, config.argv(), cwd=config.cwd, env=config.env, timeout=_timeout(config, context))
        details.update(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            stdout_tail=_tail(result.stdout),
            stderr_tail=_tail(result.stderr),
        )
        if result.timed_out:
            return EvaluationResult(reward=0.0, details=details)
        if config.expected_pass is None:
            reward = 1.0 if result.exit_code in config.pass_exit_codes else 0.0
            return EvaluationResult(reward=reward, details=details)
        if config.results_file:
            outcomes = parse_junit_xml(await _read_report(target, config.results_file))
        else:
            outcomes = parse_pytest_output(result.stdout + "\n" + result.stderr)
        reward, scored = score(config, outcomes)
        return EvaluationResult(reward=reward, details={**details, **scored})
