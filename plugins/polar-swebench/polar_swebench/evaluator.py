"""``swebench_harness``: grade the agent's patch with the instance's tests in a fresh runtime.

1. The patch: ``patch_command`` runs in the agent's runtime (in ``cwd``, default the runtime's workdir, e.g.
   ``/testbed``; it sees ``POLAR_BASE_COMMIT`` = the instance's base commit) and prints a git diff; sections of
   harness droppings (``exclude``) are removed. An empty patch scores 0.0.
2. It is applied in the fresh runtime (``evaluator.refresh_runtime: true``: started from the same image while the agent
   ran) with ``git apply --verbose``, else ``patch --batch --fuzz=5 -p1``; a patch that does not apply scores 0.0.
3. The instance's eval script (see :mod:`polar_swebench.scripts`) runs there under ``eval_timeout_seconds`` (also
   bounded by ``EvaluatorSpec.timeout_seconds``, the evaluation budget, separate from the agent's), stdout and
   stderr merged into one log; the log's tail is kept in the result (the whole log under ``log_dir`` when set).
4. :func:`polar_swebench.grading.grade` decides: reward 1.0 when resolved, else 0.0.

The report (patch applied or why not, each FAIL_TO_PASS / PASS_TO_PASS test's status, resolved, reason) is the
result's ``details``: the session result's ``metadata.evaluation`` and the exported rows.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.api import (
    ConfigError,
    EvaluationContext,
    EvaluationError,
    EvaluationResult,
    Evaluator,
    ExecResult,
    PolarError,
    RuntimeHandle,
    StrictModel,
    tail,
)
from polar_swebench.grading import grade, output_section
from polar_swebench.instance import SweInstance
from polar_swebench.patch import DEFAULT_EXCLUDE, DEFAULT_PATCH_COMMAND, GIT_APPLY, PATCH_FALLBACK, filter_patch
from polar_swebench.scripts import EvalPlan, eval_plan

NAME = "swebench_harness"
LOG_KEEP = 64_000  # characters of the eval log kept in the result
OUTPUT_KEEP = 4_000
SCRIPT_NAME = "polar-swebench/eval.sh"  # in the fresh runtime's session dir, never in the repository
# stderr merged into stdout inside the runtime, so the log keeps the order the script wrote it in
RUN_SCRIPT = 'exec bash "$1" 2>&1'


class SwebenchHarnessConfig(StrictModel):
    """``EvaluatorSpec.config`` of ``swebench_harness``."""

    instance: SweInstance = Field(description="the SWE instance (SWE-bench / SWE-Gym row)")
    patch_command: str = Field(default=DEFAULT_PATCH_COMMAND, description="prints the agent's patch (bash -lc)")
    exclude: list[str] = Field(default_factory=lambda: list(DEFAULT_EXCLUDE), description="paths dropped from it")
    cwd: str | None = Field(default=None, description="the repository (default: the runtime's workdir)")
    eval_timeout_seconds: float | None = Field(default=1800.0, gt=0, description="the test run's own limit")
    log_dir: str | None = Field(default=None, description="host folder for the full eval logs (<session>.log)")


def _limit(seconds: float | None, context: EvaluationContext) -> float | None:
    left = context.remaining()
    if seconds is None:
        return left
    return seconds if left is None else min(seconds, left)


async def _exec(handle: RuntimeHandle, argv: list[str], **kwargs: Any) -> ExecResult:
    try:
        return await handle.exec(argv, **kwargs)
    except PolarError as exc:
        raise EvaluationError(f"{NAME}: {exc}") from exc


def _output(result: ExecResult) -> str:
    return tail((result.stdout + "\n" + result.stderr).strip(), OUTPUT_KEEP)


async def take_patch(
    agent: RuntimeHandle, config: SwebenchHarnessConfig, timeout: float | None
) -> tuple[str | None, dict[str, Any]]:
    """The agent's cleaned patch (None when it could not be taken) and what to report about it."""
    env = {"POLAR_BASE_COMMIT": config.instance.base_commit} if config.instance.base_commit else {}
    made = await _exec(agent, ["bash", "-lc", config.patch_command], cwd=config.cwd, env=env, timeout=timeout)
    if not made.ok:
        reason = "timed out" if made.timed_out else f"exited {made.exit_code}"
        return None, {"reason": f"patch_command {reason}: {_output(made)}"}
    patch, dropped = filter_patch(made.stdout, config.exclude)
    return patch, {"patch_dropped": dropped, "patch_bytes": len(patch.encode())}


async def apply_patch(
    fresh: RuntimeHandle, patch: str, cwd: str | None, timeout: float | None
) -> tuple[str | None, str]:
    """Apply ``patch`` with git apply, else patch(1): (the method that worked or None, what the tools said)."""
    said = []
    for method, argv in (("git apply", GIT_APPLY), ("patch", PATCH_FALLBACK)):
        result = await _exec(fresh, argv, cwd=cwd, stdin=patch.encode(), timeout=timeout)
        if result.ok:
            return method, ""
        said.append(f"{method}: {_output(result)}")
    return None, "\n".join(said)


async def run_eval_script(
    fresh: RuntimeHandle, plan: EvalPlan, cwd: str | None, timeout: float | None
) -> ExecResult:
    path = posixpath.join(fresh.session_path, SCRIPT_NAME)
    try:
        await fresh.write_file(path, plan.script, mode=0o755)
    except PolarError as exc:
        raise EvaluationError(f"{NAME}: cannot write the eval script: {exc}") from exc
    return await _exec(fresh, ["bash", "-c", RUN_SCRIPT, "polar-eval", path], cwd=cwd, timeout=timeout)


def _keep_log(config: SwebenchHarnessConfig, session_id: str, log: str) -> str | None:
    if not config.log_dir:
        return None
    path = Path(config.log_dir) / f"{session_id}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(log, encoding="utf-8")
    except OSError as exc:
        raise EvaluationError(f"{NAME}: cannot write the eval log {path}: {exc}") from exc
    return str(path)


def _result(resolved: bool, details: dict[str, Any]) -> EvaluationResult:
    return EvaluationResult(reward=1.0 if resolved else 0.0, details=details)


class SwebenchHarnessEvaluator(Evaluator):
    """Runs the SWE-bench test harness on the agent's patch."""

    name: ClassVar[str] = NAME
    description: ClassVar[str] = "SWE-bench harness: apply the agent's patch, run FAIL_TO_PASS/PASS_TO_PASS tests"

    options: ClassVar[type[BaseModel]] = SwebenchHarnessConfig

    def check_config(self, config: Mapping[str, Any]) -> None:
        parsed: SwebenchHarnessConfig = self.parse_config(config)
        try:
            eval_plan(parsed.instance)
        except EvaluationError as exc:
            raise ConfigError(f"evaluator {NAME!r}: {exc}") from exc

    async def evaluate(self, context: EvaluationContext) -> EvaluationResult:
        config: SwebenchHarnessConfig = self.parse_config(context.config)
        instance = config.instance
        plan = eval_plan(instance)
        if context.fresh_runtime is None or context.runtime is None:
            raise EvaluationError(
                f"{NAME}: needs the agent's runtime and a fresh one: set evaluator.refresh_runtime: true"
            )
        details: dict[str, Any] = {"instance_id": instance.instance_id, "repo": instance.repo,
                                   "script_source": plan.source, "patch_applied": False, "resolved": False}  # fmt: skip
        patch, about = await take_patch(context.runtime, config, _limit(None, context))
        details.update(about)
        if patch is None:
            return _result(False, details)
        if not patch.strip():
            details["reason"] = "empty patch: the agent changed no file" + (
                f" (only {', '.join(about['patch_dropped'][:5])}, which are dropped)" if about["patch_dropped"] else ""
            )
            return _result(False, details)
        method, said = await apply_patch(context.fresh_runtime, patch, config.cwd, _limit(None, context))
        if method is None:
            details["reason"] = f"the patch does not apply:\n{said}"
            return _result(False, details)
        details.update(patch_applied=True, apply_method=method)

        limit = _limit(config.eval_timeout_seconds, context)
        run = await run_eval_script(context.fresh_runtime, plan, config.cwd, limit)
        log = run.stdout + (f"\n{run.stderr}" if run.stderr else "")
        details.update(eval_exit_code=run.exit_code, eval_timed_out=run.timed_out, log=tail(log, LOG_KEEP))
        log_path = _keep_log(config, context.session_id, log)
        if log_path:
            details["log_path"] = log_path
        try:
            statuses = plan.parse(output_section(log))
        except Exception as exc:  # a parser that cannot read this log
            raise EvaluationError(f"{NAME}: the log parser failed on the eval log: {exc}") from exc
        run_error = "the eval script timed out" if run.timed_out else None
        report = grade(statuses, instance.fail_to_pass, instance.pass_to_pass, log=log, run_error=run_error)
        details.update(report.as_details())
        return _result(report.resolved, details)
