"""``swebench_harness``: grade the agent's patch with the instance's tests in a fresh runtime.

0. The instance: the SWE row in ``instance``, or (the paper's payload) only its ``instance_id``, looked up now in the
   dataset the operator configured where it grades (:mod:`polar_swebench.lookup`); an id that cannot be found is an
   EvaluationError naming it (the session ends ``error`` with that message).
1. The patch: ``patch_command`` runs in the agent's runtime (in ``repo_dir``, default the runtime's workdir, e.g.
   ``/testbed``; it sees ``POLAR_BASE_COMMIT`` = the instance's base commit) and prints a git diff; sections of
   harness droppings (``exclude``) are removed. An empty patch scores 0.0.
2. It is applied in the fresh runtime's ``repo_dir`` (``evaluator.refresh_runtime: true``: started from the same image
   while the agent ran) with ``git apply --verbose``, else ``patch --batch --fuzz=5 -p1``; a patch that does not apply
   scores 0.0.
3. The instance's eval script (see :mod:`polar_swebench.scripts`) runs there under ``eval_timeout_seconds`` (also
   bounded by ``EvaluatorSpec.timeout_seconds``, the evaluation budget, separate from the agent's), stdout and
   stderr merged into one log; the log's tail is kept in the result (the whole log under the operator's
   ``POLAR_SWEBENCH_LOG_DIR`` when set).
4. :func:`polar_swebench.grading.grade` decides: reward 1.0 when resolved, else 0.0.

The report (patch applied or why not, each FAIL_TO_PASS / PASS_TO_PASS test's status, resolved, reason) is the
result's ``details``: the session result's ``metadata.evaluation`` and the exported rows.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, ValidatorFunctionWrapHandler, field_validator

from polar_cli.api import (
    SESSION_PATH,
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
from polar_swebench.lookup import InstanceRef, lookup_instance
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

    instance: SweInstance | InstanceRef = Field(
        description="the SWE instance (SWE-bench / SWE-Gym row), or only its instance_id: looked up when grading"
    )
    patch_command: str = Field(default=DEFAULT_PATCH_COMMAND, description="prints the agent's patch (bash -lc)")
    exclude: list[str] = Field(default_factory=lambda: list(DEFAULT_EXCLUDE), description="paths dropped from it")
    repo_dir: str | None = Field(
        default=None, description="the repository inside the runtime, e.g. /testbed (default: the runtime's workdir)"
    )
    eval_timeout_seconds: float | None = Field(default=1800.0, gt=0, description="the test run's own limit")

    @field_validator("instance", mode="wrap")
    @classmethod
    def _instance_or_id(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """``{"instance_id": ...}`` alone is a reference; any other mapping is a full row (errors name its fields)."""
        if isinstance(value, Mapping):
            model = InstanceRef if set(value) == {"instance_id"} else SweInstance
            return model.model_validate(dict(value))
        return handler(value)

    @field_validator("repo_dir")
    @classmethod
    def _runtime_path(cls, value: str | None) -> str | None:
        """A directory inside the runtime: absolute, no ``..``; see :func:`runtime_dir`."""
        return None if value is None else runtime_dir(value)


def runtime_dir(path: str) -> str:
    """``path`` as a directory inside the runtime, normalised; ValueError unless it is absolute (the runtime's own
    root: ``/testbed`` in an SWE image) with no ``..`` part and no control character.

    ``repo_dir`` is only ever the working directory of commands the evaluator runs through the runtime (exec in the
    container); Polar never opens it on the host. Absolute, so it means the same in the agent's runtime and the fresh
    one (a relative path would be resolved against each session's own directory); no ``..``, so it names the directory
    it says and nothing above it.
    """
    if any(ord(c) < 32 for c in path):
        raise ValueError("must not contain control characters")
    if not path.startswith("/"):
        raise ValueError(f"{path!r} must be an absolute path inside the runtime, e.g. /testbed")
    if ".." in path.split("/"):
        raise ValueError(f"{path!r} must not contain '..'")
    return posixpath.normpath(path)


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
    agent: RuntimeHandle, instance: SweInstance, config: SwebenchHarnessConfig, timeout: float | None
) -> tuple[str | None, dict[str, Any]]:
    """The agent's cleaned patch (None when it could not be taken) and what to report about it."""
    env = {"POLAR_BASE_COMMIT": instance.base_commit} if instance.base_commit else {}
    made = await _exec(agent, ["bash", "-lc", config.patch_command], cwd=config.repo_dir, env=env, timeout=timeout)
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


async def run_eval_script(fresh: RuntimeHandle, plan: EvalPlan, cwd: str | None, timeout: float | None) -> ExecResult:
    path = posixpath.join(fresh.session_path, SCRIPT_NAME)
    try:
        await fresh.write_file(path, plan.script, mode=0o755)
    except PolarError as exc:
        raise EvaluationError(f"{NAME}: cannot write the eval script: {exc}") from exc
    return await _exec(fresh, ["bash", "-c", RUN_SCRIPT, "polar-eval", path], cwd=cwd, timeout=timeout)


LOG_DIR_ENV = "POLAR_SWEBENCH_LOG_DIR"
"""The operator's host folder for the full eval logs (``<session>.log``): set where Polar grades, never by a task (a
task naming a host folder to write into would reach the host file system)."""


def _keep_log(session_id: str, log: str) -> str | None:
    folder = os.environ.get(LOG_DIR_ENV)
    if not folder:
        return None
    path = Path(folder) / f"{session_id}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(log, encoding="utf-8")
    except OSError as exc:
        raise EvaluationError(f"{NAME}: cannot write the eval log {path}: {exc}") from exc
    return str(path)


async def _instance(config: SwebenchHarnessConfig) -> SweInstance:
    """The instance: given in full, or looked up by id in the operator's dataset (in a thread: it may read files)."""
    if isinstance(config.instance, SweInstance):
        return config.instance
    try:
        return await asyncio.to_thread(lookup_instance, config.instance.instance_id)
    except EvaluationError as exc:
        raise EvaluationError(f"{NAME}: {exc}") from exc


def _check_local_repo_dir(config: SwebenchHarnessConfig, context: EvaluationContext) -> None:
    """The ``local`` runtime runs on the host itself: there ``repo_dir`` must lie in the session's own directory."""
    if config.repo_dir is None or context.task is None or context.task.runtime.backend != "local":
        return
    if config.repo_dir != SESSION_PATH and not config.repo_dir.startswith(SESSION_PATH + "/"):
        raise EvaluationError(f"{NAME}: repo_dir {config.repo_dir!r} is a host path under the local runtime: "
                              f"give a directory under {SESSION_PATH} (or use a container runtime)")  # fmt: skip


def _result(resolved: bool, details: dict[str, Any]) -> EvaluationResult:
    return EvaluationResult(reward=1.0 if resolved else 0.0, details=details)


class SwebenchHarnessEvaluator(Evaluator):
    """Runs the SWE-bench test harness on the agent's patch."""

    name: ClassVar[str] = NAME
    description: ClassVar[str] = "SWE-bench harness: apply the agent's patch, run FAIL_TO_PASS/PASS_TO_PASS tests"

    options: ClassVar[type[BaseModel]] = SwebenchHarnessConfig

    def check_config(self, config: Mapping[str, Any]) -> None:
        parsed: SwebenchHarnessConfig = self.parse_config(config)
        if isinstance(parsed.instance, InstanceRef):
            return  # looked up and checked when graded, where the operator's dataset is
        try:
            eval_plan(parsed.instance)
        except EvaluationError as exc:
            raise ConfigError(f"evaluator {NAME!r}: {exc}") from exc

    async def evaluate(self, context: EvaluationContext) -> EvaluationResult:
        config: SwebenchHarnessConfig = self.parse_config(context.config)
        if context.fresh_runtime is None or context.runtime is None:
            raise EvaluationError(
                f"{NAME}: needs the agent's runtime and a fresh one: set evaluator.refresh_runtime: true"
            )
        _check_local_repo_dir(config, context)
        instance = await _instance(config)
        plan = eval_plan(instance)
        details: dict[str, Any] = {"instance_id": instance.instance_id, "repo": instance.repo,
                                   "base_commit": instance.base_commit, "version": instance.version,
                                   "script_source": plan.source, "patch_applied": False, "resolved": False}  # fmt: skip
        patch, about = await take_patch(context.runtime, instance, config, _limit(None, context))
        details.update(about)
        if patch is None:
            return _result(False, details)
        if not patch.strip():
            details["reason"] = "empty patch: the agent changed no file" + (
                f" (only {', '.join(about['patch_dropped'][:5])}, which are dropped)" if about["patch_dropped"] else ""
            )
            return _result(False, details)
        method, said = await apply_patch(context.fresh_runtime, patch, config.repo_dir, _limit(None, context))
        if method is None:
            details["reason"] = f"the patch does not apply:\n{said}"
            return _result(False, details)
        details.update(patch_applied=True, apply_method=method)

        limit = _limit(config.eval_timeout_seconds, context)
        run = await run_eval_script(context.fresh_runtime, plan, config.repo_dir, limit)
        log = run.stdout + (f"\n{run.stderr}" if run.stderr else "")
        details.update(eval_exit_code=run.exit_code, eval_timed_out=run.timed_out, log=tail(log, LOG_KEEP))
        log_path = _keep_log(context.session_id, log)
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
