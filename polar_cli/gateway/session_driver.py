"""The real SessionDriver: runtimes, the harness, the in-process proxy, the task's builder and evaluator.

Per session (``job.task`` is its TaskRequest):

- INIT: a proxy session (id = the session id; the task's ``metadata.script``, if any, is the scripted backend's
  per-session script; ``agent.sampling`` is forced onto its every model call), then the runtime from ``task.runtime``
  with its prepare actions (a ready one from the gateway's sandbox pool, ``polar_cli.runtimes.pool``, when it has one).
- RUNNING: with ``evaluator.refresh_runtime`` a second runtime from the same spec starts in the background (prewarmed
  for evaluation); the harness runs until it exits, the agent deadline passes or the session hits one of its
  ``agent.limits`` (then its process group is killed: ``timeout``, ``limit``). When it ends, the proxy session is
  closed (nothing more can be recorded) and what it captured is kept.
- POSTRUN: the captured completions, ``build_trajectory(task.builder.strategy, completions, context=...,
  **task.builder.config)`` in a thread (the BuildContext carries the session's ids, task metadata, status and the served
  model's tokenizer when one is found), then the evaluator plugin with the agent's runtime and the fresh one.
- teardown: both runtimes (``cancel()`` when immediate, else ``stop()``; with ``runtime.reuse: reset`` and a run that
  ended ``completed``, ``timeout`` or ``limit``, the agent's goes back to the pool to be reset) and the proxy session;
  idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from polar_cli.builders import build_trajectory
from polar_cli.errors import HarnessError, PolarError, RuntimeFailure, SessionError
from polar_cli.gateway.jobs import Built, RunOutcome, SessionJob
from polar_cli.gateway.model_tokenizer import ModelTokenizerFinder
from polar_cli.harnesses.run import context_for, failure_report, run_harness, tail
from polar_cli.interfaces.builder import BuildContext
from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult
from polar_cli.interfaces.harness import Harness, HarnessRun
from polar_cli.interfaces.runtime import RuntimeHandle
from polar_cli.models import Completion, TaskRequest, Trajectory, TrajectoryStatus
from polar_cli.proxy import ProxyState, SessionGuard
from polar_cli.registry import get_evaluator, get_harness
from polar_cli.runtimes.pool import SandboxPool, SandboxRecipe

FRESH_SUFFIX = "-eval"  # the refresh runtime's session id: <session>-eval
REUSABLE_AFTER = ("completed", "timeout", "limit")
"""Run endings after which a ``reuse: reset`` sandbox may be reset for another session (an error or a cancellation
destroys it)."""


def _task(job: SessionJob) -> TaskRequest:
    if job.task is None:
        raise SessionError(f"session {job.session_id} has no task")
    return job.task


def tools_dir_for(harness: Harness) -> Path | None:
    """The tools dir; a harness with a pinned CLI must be installed, one that installs nothing may run without."""
    if harness.is_installed():
        return harness.tools_dir()
    if harness.version:
        raise HarnessError(f"harness {harness.name!r} is not installed: run `polar harness install {harness.name}`")
    return None


class GatewaySessionDriver:
    """Drives real sessions; ``proxy.base_url`` must be set (the gateway is listening) before INIT runs."""

    def __init__(
        self,
        proxy: ProxyState,
        *,
        scratch_root: Path | None = None,
        base_dir: Path | None = None,
        node_id: str | None = None,
        pool: SandboxPool | None = None,
    ) -> None:
        self.proxy = proxy
        self.scratch_root = scratch_root
        self.node_id = node_id
        """The gateway node every runtime started here is labelled with (``RuntimeContext.node_id``)."""
        self.base_dir = base_dir
        """Where relative ``upload`` sources of prepare actions are found (the task file's folder)."""
        self.tokenizers = ModelTokenizerFinder(proxy)
        self.pool = pool or SandboxPool()
        """Where runtimes come from and go back to (disabled by default: each session starts and stops its own)."""

    def recipe(self, task: TaskRequest) -> SandboxRecipe:
        """How the task's runtimes start (its spec, its harness's tools dir, the task folder, the scratch root, the
        node that labels them)."""
        tools = tools_dir_for(get_harness(task.agent.harness))
        return SandboxRecipe(task.runtime, tools, self.base_dir, self.scratch_root, self.node_id)

    async def init(self, job: SessionJob) -> None:
        task = _task(job)
        recipe = self.recipe(task)
        metadata = {**task.metadata, "task_id": task.task_id, "sample_index": job.sample_index}
        # fresh: an earlier attempt of this session id (e.g. on a killed gateway) recorded calls that are not this one's
        info = await self.proxy.create_session(job.session_id, metadata, fresh=True, sampling=task.agent.sampling,
                                               limits=task.agent.limits, token_mode=task.agent.token_mode,
                                               keep_reasoning=task.agent.keep_reasoning)  # fmt: skip
        job.resources.proxy_key = info["api_key"]
        job.resources.runtime = await self.pool.acquire(recipe, job.session_id)

    async def run(self, job: SessionJob, deadline: float | None) -> RunOutcome:
        task = _task(job)
        harness = get_harness(task.agent.harness)
        resources = job.resources
        handle, api_key = resources.runtime, resources.proxy_key
        if handle is None or api_key is None:
            raise SessionError(f"session {job.session_id} reached RUNNING without its runtime and proxy session")
        if task.evaluator.refresh_runtime:  # never a used sandbox: a fresh one from the pool at most
            fresh = self.pool.acquire(self.recipe(task), job.session_id + FRESH_SUFFIX, evaluation=True)
            resources.prewarm = asyncio.create_task(fresh)
        context = context_for(
            handle,
            instruction=task.instruction,
            model=task.agent.model_name or self.proxy.config.model or "polar",
            api_key=api_key,
            base_urls=self.proxy.urls(job.session_id),
            config=task.agent.config,
        )
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.proxy.registry.set_deadline(job.session_id, deadline)  # no model call outlives the agent's deadline
        session = self.proxy.registry.get(job.session_id)
        harness_run = asyncio.create_task(run_harness(harness, handle, context, timeout=timeout, env=task.agent.env))
        try:
            run = await _until_limit(harness_run, session.guard)
        finally:
            if not harness_run.done():
                harness_run.cancel()  # kills the harness's process group
                await asyncio.wait({harness_run})
            await self._close_proxy_session(job)  # nothing is recorded after the run, whatever ended it
        hit = session.limit_hit
        if hit is not None:  # also when the harness ended by itself on the refused call
            stopped: dict[str, Any] = {"limit": hit.as_dict()}
            if run is not None:
                stopped.update(exit_code=run.exit_code, seconds=round(run.seconds, 3))
            stderr = tail(run.stderr) if run is not None and run.stderr else None
            return RunOutcome("limit", error=hit.message, stderr=stderr, details=stopped)
        if run is None:
            raise SessionError(f"session {job.session_id}: the harness was stopped for a limit it did not hit")
        details: dict[str, Any] = {"exit_code": run.exit_code, "seconds": round(run.seconds, 3)}
        stderr = tail(run.stderr) if run.stderr else None
        if run.timed_out:
            budget = job.budget.agent_seconds or timeout
            return RunOutcome("timeout", error=f"the agent did not finish within its budget of {budget:g} s",
                              stderr=stderr, details=details)  # fmt: skip
        if not run.ok:
            return RunOutcome("error", error=failure_report(harness, run), stderr=stderr, details=details)
        return RunOutcome("completed", stderr=stderr, details=details)

    async def _close_proxy_session(self, job: SessionJob) -> None:
        """Snapshot the captured completions, then stop routing the session (idempotent)."""
        resources = job.resources
        if resources.captured is not None or resources.proxy_key is None:
            return
        resources.captured = self.proxy.get_completions(job.session_id)
        with contextlib.suppress(SessionError):
            job.model_requests = (await self.proxy.close_session(job.session_id)).model_requests

    async def collect(self, job: SessionJob) -> list[Completion]:
        await self._close_proxy_session(job)
        return list(job.resources.captured or [])

    async def build_context(self, job: SessionJob, status: TrajectoryStatus) -> BuildContext:
        task = _task(job)
        tokenizer = await self.tokenizers.find()
        return BuildContext(
            session_id=job.session_id,
            task_id=task.task_id,
            harness=task.agent.harness,
            task_metadata=dict(job.metadata),  # the task's, without the scripted backend's script, with the attempt
            status=status,
            tokenizer=tokenizer.name_or_path if tokenizer is not None else None,
            tokenizer_source=tokenizer.source if tokenizer is not None else None,
        )

    async def build(self, job: SessionJob, outcome: RunOutcome, completions: list[Completion]) -> Trajectory:
        task = _task(job)
        context = await self.build_context(job, outcome.status)
        return await asyncio.to_thread(
            build_trajectory, task.builder.strategy, completions, context=context, **task.builder.config
        )

    async def evaluate(
        self, job: SessionJob, outcome: RunOutcome, built: Built, deadline: float | None
    ) -> EvaluationResult:
        task = _task(job)
        resources = job.resources
        if resources.prewarm is not None and resources.fresh is None:
            resources.fresh = await resources.prewarm  # prewarmed during RUNNING; the pipeline bounds this wait
        context = EvaluationContext(
            session_id=job.session_id,
            status=outcome.status,
            completions=built.completions,
            trajectory=built.trajectory,
            config=task.evaluator.config,
            runtime=resources.runtime,
            fresh_runtime=resources.fresh,
            deadline=deadline,
            task=task,
        )
        return await get_evaluator(task.evaluator.strategy).evaluate(context)

    async def teardown(self, job: SessionJob, *, immediate: bool) -> None:
        problems: list[str] = []
        resources = job.resources
        prewarm, resources.prewarm = resources.prewarm, None
        if prewarm is not None:
            if not prewarm.done():
                prewarm.cancel()  # start_session tears down whatever it had started
            try:
                resources.fresh = await prewarm
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this teardown itself is being cancelled
            except PolarError as exc:
                problems.append(f"fresh runtime: {exc}")
        # each handle is kept until it is really gone, so an immediate retry tries again
        if resources.fresh is not None and await self._released(resources.fresh, immediate, False, problems):
            resources.fresh = None
        reuse = job.outcome is not None and job.outcome.status in REUSABLE_AFTER and not job.cancel_requested
        if resources.runtime is not None and await self._released(resources.runtime, immediate, reuse, problems):
            resources.runtime = None
        try:
            await self._close_proxy_session(job)
        except PolarError as exc:
            problems.append(f"proxy session: {exc}")
        if problems:
            raise RuntimeFailure("; ".join(problems))

    async def _released(self, handle: RuntimeHandle, immediate: bool, reuse: bool, problems: list[str]) -> bool:
        """Stop (or, ``immediate``, cancel) ``handle``, or give it back for reuse; whether it is gone, else the
        problem is added to ``problems``."""
        try:
            await self.pool.release(handle, reuse=reuse, immediate=immediate)
        except PolarError as exc:
            problems.append(str(exc))
            return False
        return True


async def _until_limit(harness_run: asyncio.Task[HarnessRun], guard: SessionGuard | None) -> HarnessRun | None:
    """The harness's run, or None as soon as the session hits one of its limits (the caller stops the harness)."""
    if guard is None:
        return await harness_run
    tripped = asyncio.create_task(guard.tripped.wait())
    try:
        await asyncio.wait({harness_run, tripped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        tripped.cancel()
    return harness_run.result() if harness_run.done() else None
