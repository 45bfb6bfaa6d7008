"""The staged session pipeline: INIT -> READY -> RUNNING -> POSTRUN, each stage its own bounded worker pool.

::

    submit ─► [init queue] ─► INIT workers ─► [READY buffer] ─► run slots ─► [postrun queue] ─► POSTRUN workers
              unbounded        start runtime    bounded:         harness,      optional bound     build, evaluate,
                               + prepare        backpressure     one deadline                     teardown, result

Slow runtime starts and long evaluations happen in their own pools, so a run slot only ever runs a harness. Every
session ends with exactly one SessionResult, written to the ResultStore before waiters and callbacks hear of it:
``completed``, ``timeout`` (the agent deadline passed; what it captured is still built and evaluated), ``limit`` (the
session hit one of its ``agent.limits`` and its harness was stopped: built and evaluated like ``timeout``), ``error`` (a
stage failed; teardown still runs), ``no_model_call`` (the harness ran but not one model call reached the proxy:
nothing to evaluate or train on), ``cancelled`` (:meth:`StagedPipeline.cancel`, in any stage: the runtime is torn
down at once, without waiting for a worker) or ``stale`` (cancelled the same way because it sampled under weights too
old: ``cancel(..., status="stale")``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from polar_cli.builders.roles import DEFAULT_REWARD_TO, assign_rewards
from polar_cli.errors import PolarError, SessionError
from polar_cli.gateway.config import PipelineConfig
from polar_cli.gateway.driver import SessionDriver
from polar_cli.gateway.jobs import Built, RunOutcome, SessionJob, Stage
from polar_cli.gateway.queues import StageQueue
from polar_cli.gateway.results import ResultStore
from polar_cli.metrics import GatewayMetrics
from polar_cli.models import SessionResult, Trajectory, TrajectoryStatus
from polar_cli.trainers.shaping import shape_reward, shape_trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")
ResultCallback = Callable[[SessionResult], Awaitable[None] | None]
RUN_STATUSES = ("completed", "timeout", "error", "limit")


class _JobCancelled(Exception):
    """The session was cancelled while a worker held it."""


class _OverBudget(Exception):
    """A stage's budget ran out."""


def describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, PolarError) else f"{type(exc).__name__}: {exc}"


def _join(*messages: str | None) -> str | None:
    return "; ".join(m for m in messages if m) or None


def no_model_call_cause(outcome: RunOutcome) -> str:
    """Why a session that ran produced nothing to train on, in words a user can act on."""
    endings = {"completed": "exited", "timeout": "ran out of time", "error": "failed", "limit": "hit a limit"}
    how = endings.get(outcome.status, outcome.status)
    return (
        f"the harness {how} without a single model call reaching Polar's proxy: it bypassed the base URL it was "
        "given (check the adapter's configuration and the harness's own settings), or failed before its first call "
        "(see harness_stderr)"
    )


def _deadline_in(seconds: float | None) -> float | None:
    return None if seconds is None else time.monotonic() + seconds


async def _within(work: Awaitable[T], deadline: float | None) -> T:
    """Await ``work``, cancelling it at ``deadline`` (``time.monotonic()``) with _OverBudget."""
    if deadline is None:
        return await work
    loop = asyncio.get_running_loop()
    timeout = asyncio.timeout_at(loop.time() + (deadline - time.monotonic()))
    try:
        async with timeout:
            return await work
    except TimeoutError:
        if timeout.expired():
            raise _OverBudget from None
        raise


class StagedPipeline:
    """Runs sessions through the four stages with ``driver`` doing each stage's work.

    Use as ``async with StagedPipeline(driver, config, store=...) as pipeline:``; ``await pipeline.submit(job)``, then
    ``await pipeline.wait(session_id)`` or ``await pipeline.cancel(session_id)``. Leaving the block cancels what is
    still in flight (each still gets its result).
    """

    def __init__(
        self,
        driver: SessionDriver,
        config: PipelineConfig | None = None,
        *,
        store: ResultStore | None = None,
        on_result: Iterable[ResultCallback] = (),
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.driver = driver
        self.config = config or PipelineConfig()
        self.store = store
        self.exported = metrics or GatewayMetrics()
        """Its Prometheus metrics: read from :meth:`metrics` at scrape time, plus each result's stage durations."""
        self.exported.watch(self.metrics)
        self._callbacks = list(on_result)
        self._pending: StageQueue[SessionJob] = StageQueue()
        self._ready: StageQueue[SessionJob] = StageQueue(self.config.ready_capacity)
        self._postrun: StageQueue[SessionJob] = StageQueue(self.config.postrun_capacity)
        self._active: dict[str, SessionJob] = {}
        self._finished: OrderedDict[str, SessionJob] = OrderedDict()
        self._workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._statuses: Counter[str] = Counter()
        self._submitted = 0
        self._run_busy_seconds = 0.0
        self._started_at: float | None = None
        self._closing = False
        self.stopping = False
        """The node is draining (``GatewayNode.draining``): a run that fails now was most likely cut off by the stop
        itself (a scheduler signals every process of the job, the harness's too), so its session is handed back
        (``cancelled``: the rollout server runs it again) rather than reported as failed."""

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._workers:
            return
        self._started_at = time.monotonic()
        pools: list[tuple[str, int, StageQueue[SessionJob], Callable[[SessionJob], Awaitable[None]]]] = [
            ("init", self.config.init_workers, self._pending, self._init_one),
            ("run", self.config.run_slots, self._ready, self._run_one),
            ("postrun", self.config.postrun_workers, self._postrun, self._postrun_one),
        ]
        for name, size, queue, handle in pools:
            for i in range(size):
                self._workers.append(asyncio.create_task(self._worker(queue, handle), name=f"polar-{name}-{i}"))

    async def close(self) -> None:
        """Cancel every unfinished session (each still gets a result), then stop the workers."""
        self._closing = True
        await asyncio.gather(
            *(self.cancel(sid, "the gateway is shutting down") for sid in list(self._active)), return_exceptions=True
        )
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def __aenter__(self) -> StagedPipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- public API ---------------------------------------------------------------------------------------------

    async def submit(self, job: SessionJob) -> SessionJob:
        """Queue ``job`` for INIT (never refused for lack of capacity)."""
        if not self._workers or self._closing:
            raise SessionError("the pipeline is not running")
        if job.session_id in self._active or job.session_id in self._finished:
            raise SessionError(f"session {job.session_id!r} already exists")
        job.stage = Stage.INIT_QUEUED
        job.mark("submitted")
        self._active[job.session_id] = job
        self._submitted += 1
        await self._pending.put(job)
        return job

    def get(self, session_id: str) -> SessionJob:
        job = self._active.get(session_id) or self._finished.get(session_id)
        if job is None:
            raise SessionError(f"unknown session {session_id!r}")
        return job

    def forget(self, session_id: str) -> None:
        """Drop a finished session from memory (its result stays in the store): its id may be submitted again."""
        job = self._finished.get(session_id)
        if job is not None and job.result is not None:
            del self._finished[session_id]

    def active(self) -> list[SessionJob]:
        return list(self._active.values())

    async def wait(self, session_id: str) -> SessionResult:
        """The session's result, once it is durably stored."""
        try:
            job = self.get(session_id)
        except SessionError:
            if self.store is not None and self.store.exists(session_id):
                return self.store.read(session_id)
            raise
        await job.done.wait()
        assert job.result is not None
        return job.result

    async def run(self, job: SessionJob) -> SessionResult:
        await self.submit(job)
        return await self.wait(job.session_id)

    async def cancel(
        self, session_id: str, reason: str = "cancelled by request", *, status: TrajectoryStatus = "cancelled"
    ) -> SessionResult:
        """Cancel the session wherever it is; its runtime is torn down at once. Returns its result, with ``status``
        (``cancelled``, or ``stale`` when it was cancelled for sampling under weights too old).

        A session already past evaluation finishes normally and its own result is returned.
        """
        job = self.get(session_id)
        if job.result is None and not job.cancel_requested and job.stage not in (Stage.FINISHING, Stage.FINISHED):
            job.cancel_reason, job.cancel_status = reason, status
            work = job.task_handle
            if work is not None and not work.done():
                work.cancel()  # the worker holding the session concludes it
            else:
                for queue in (self._pending, self._ready, self._postrun):
                    if await queue.remove(job):  # waiting in a queue: nobody holds it, conclude it here
                        self._spawn(self._conclude(job, status, reason, immediate=True, salvage=True))
                        break
                # else a worker holds it between two steps: its next step raises _JobCancelled
        await job.done.wait()
        assert job.result is not None
        return job.result

    def metrics(self) -> dict[str, Any]:
        """Queue depths, in-flight sessions and capacity per stage, session counts, run-slot utilization."""
        now = time.monotonic()
        stages = Counter(job.stage for job in self._active.values())
        running = [job for job in self._active.values() if job.stage is Stage.RUNNING and "run_started" in job.marks]
        busy = self._run_busy_seconds + sum(now - job.marks["run_started"] for job in running)
        uptime = now - self._started_at if self._started_at is not None else 0.0
        cfg = self.config
        init = {"capacity": cfg.init_workers, "in_flight": stages[Stage.INIT], "queued": stages[Stage.INIT_QUEUED]}
        ready = {"capacity": cfg.ready_capacity, "queued": len(self._ready),
                 "blocked": stages[Stage.READY] - len(self._ready)}  # fmt: skip
        postrun = {"capacity": cfg.postrun_workers, "in_flight": stages[Stage.POSTRUN],
                   "queued": stages[Stage.POSTRUN_QUEUED], "queue_capacity": cfg.postrun_capacity}  # fmt: skip
        return {
            "stages": {
                "init": init,
                "ready": ready,
                "running": {"capacity": cfg.run_slots, "in_flight": stages[Stage.RUNNING]},
                "postrun": postrun,
            },
            "sessions": {
                "submitted": self._submitted,
                "active": len(self._active),
                "finishing": stages[Stage.FINISHING],
                "finished": dict(self._statuses),
            },
            "run_slots": {
                "busy_seconds": round(busy, 6),
                "utilization": round(busy / (cfg.run_slots * uptime), 6) if uptime > 0 else 0.0,
            },
            "uptime_seconds": round(uptime, 6),
        }

    # ---- workers ------------------------------------------------------------------------------------------------

    async def _worker(self, queue: StageQueue[SessionJob], handle: Callable[[SessionJob], Awaitable[None]]) -> None:
        while True:
            job = await queue.get()
            try:
                await handle(job)
            except Exception as exc:  # a bug in a stage handler must not shrink the pool or lose the session
                log.exception("session %s: internal pipeline error", job.session_id)
                await self._conclude(job, "error", f"internal pipeline error: {describe(exc)}", immediate=True)

    async def _step(self, job: SessionJob, work: Coroutine[Any, Any, T], deadline: float | None = None) -> T:
        """Run one piece of a session's stage work as its own task, so :meth:`cancel` can interrupt exactly it."""
        if job.cancel_requested:
            work.close()
            raise _JobCancelled
        task = asyncio.create_task(_within(work, deadline))
        job.task_handle = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the worker itself is being stopped
            if job.cancel_requested:
                raise _JobCancelled from None
            raise SessionError("stage work was cancelled from inside") from None
        finally:
            if job.task_handle is task:  # a put step's task ends after the next stage may have started its own
                job.task_handle = None

    async def _init_one(self, job: SessionJob) -> None:
        job.stage = Stage.INIT
        job.mark("init_started")
        try:
            await self._step(job, self.driver.init(job), _deadline_in(job.budget.init_seconds))
            job.mark("init_finished")
            job.stage = Stage.READY
            await self._step(job, self._ready.put(job))  # waits while READY is full: INIT backs off
        except _JobCancelled:
            self._spawn(self._conclude(job, job.cancel_status, job.cancel_reason, immediate=True))
        except _OverBudget:
            await self._conclude(job, "error", f"init exceeded its budget of {job.budget.init_seconds:g} s",
                                 immediate=True)  # fmt: skip
        except Exception as exc:
            await self._conclude(job, "error", f"init failed: {describe(exc)}", immediate=True)

    async def _run_one(self, job: SessionJob) -> None:
        job.stage = Stage.RUNNING
        started = job.mark("run_started")
        budget = job.budget.agent_seconds
        job.deadline = None if budget is None else started + budget
        hard = None if job.deadline is None else job.deadline + self.config.deadline_grace_seconds
        try:
            outcome = await self._step(job, self.driver.run(job, job.deadline), hard)
            if outcome.status not in RUN_STATUSES:
                outcome = RunOutcome("error", error=f"the driver reported run status {outcome.status!r}")
        except _JobCancelled:
            self._run_ended(job)
            self._spawn(self._conclude(job, job.cancel_status, job.cancel_reason, immediate=True, salvage=True))
            return
        except _OverBudget:
            outcome = RunOutcome("timeout", error=f"the agent did not finish within its budget of {budget:g} s")
        except Exception as exc:
            outcome = RunOutcome("error", error=f"run failed: {describe(exc)}")
        self._run_ended(job)
        if self.stopping and outcome.status == "error":
            reason = f"the gateway is stopping; the run ended meanwhile ({outcome.error or 'failed'})"
            self._spawn(self._conclude(job, "cancelled", reason, immediate=True, salvage=True))
            return
        job.outcome = outcome
        job.stage = Stage.POSTRUN_QUEUED
        try:
            await self._step(job, self._postrun.put(job))
        except _JobCancelled:
            self._spawn(self._conclude(job, job.cancel_status, job.cancel_reason, immediate=True, salvage=True))

    def _run_ended(self, job: SessionJob) -> None:
        end = job.mark("run_finished")
        self._run_busy_seconds += end - job.marks["run_started"]

    async def _postrun_one(self, job: SessionJob) -> None:
        job.stage = Stage.POSTRUN
        job.mark("postrun_started")
        outcome = job.outcome or RunOutcome("error", error="the session reached POSTRUN without a run outcome")
        status: TrajectoryStatus = outcome.status
        error = outcome.error
        try:
            built = await self._step(job, self._build(job, outcome))
            job.mark("build_finished")
            if not built.completions and not job.model_requests:  # nothing to evaluate or train on
                status, error = "no_model_call", _join(no_model_call_cause(outcome), error)
            else:
                if not built.completions:  # it reached the proxy and every call failed: the harness's ending says more
                    error = _join(error, f"{job.model_requests} model request(s) reached the proxy and none was "
                                         "recorded (each failed: see the gateway's log)")  # fmt: skip
                status, error = await self._evaluate(job, outcome, built, status, error)
            job.mark("evaluate_finished")
        except _JobCancelled:
            self._spawn(self._conclude(job, job.cancel_status, job.cancel_reason, immediate=True, salvage=True))
            return
        except Exception as exc:
            status, error = "error", _join(error, f"build failed: {describe(exc)}")
        await self._conclude(job, status, error, immediate=False)

    async def _evaluate(
        self, job: SessionJob, outcome: RunOutcome, built: Built, status: TrajectoryStatus, error: str | None
    ) -> tuple[TrajectoryStatus, str | None]:
        """Score the built trajectory within the evaluation budget; the session's status and error after it."""
        budget = job.budget.evaluation_seconds
        deadline = _deadline_in(budget)
        try:
            evaluation = await self._step(job, self.driver.evaluate(job, outcome, built, deadline), deadline)
        except _OverBudget:
            return "error", _join(error, f"evaluation exceeded its budget of {budget:g} s")
        except _JobCancelled:
            raise
        except Exception as exc:
            return "error", _join(error, f"evaluation failed: {describe(exc)}")
        job.built = Built(evaluation.apply(built.trajectory), built.completions)
        job.evaluation = evaluation
        return status, error

    async def _build(self, job: SessionJob, outcome: RunOutcome) -> Built:
        """Collect what the session captured (kept in ``job.completions`` whatever the build does), then build."""
        if job.completions is None:
            job.completions = await self.driver.collect(job)
        trajectory = await self.driver.build(job, outcome, job.completions)
        job.built = Built(trajectory, job.completions)
        return job.built

    # ---- the end of every session -------------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _conclude(
        self, job: SessionJob, status: TrajectoryStatus, error: str | None, *, immediate: bool, salvage: bool = False
    ) -> None:
        """Teardown, then (cancelled runs) salvage the partial trajectory, then publish the one result."""
        if job.stage in (Stage.FINISHING, Stage.FINISHED):
            return
        job.stage = Stage.FINISHING
        job.mark("teardown_started")
        teardown_error = await self._teardown(job, immediate=immediate)
        job.mark("teardown_finished")
        if salvage and job.built is None and "run_started" in job.marks:
            outcome = job.outcome or RunOutcome("error", error=error)
            try:
                salvage_by = _deadline_in(self.config.cancel_build_seconds)
                await _within(self._build(job, outcome), salvage_by)
            except Exception as exc:  # best effort: a cancelled session's result does not depend on it
                log.warning("session %s: could not build the partial trajectory: %s", job.session_id, describe(exc))
        job.mark("finished")
        await self._publish(job, self._result(job, status, _join(error, teardown_error)))

    async def _teardown(self, job: SessionJob, *, immediate: bool) -> str | None:
        """Free the session's resources; a graceful teardown that fails or hangs is redone immediately."""
        limit = self.config.teardown_timeout_seconds
        for now in (immediate,) if immediate else (False, True):
            try:
                await _within(self.driver.teardown(job, immediate=now), _deadline_in(limit))
                return None
            except _OverBudget:
                problem = f"teardown exceeded {limit:g} s"
            except Exception as exc:
                problem = f"teardown failed: {describe(exc)}"
            log.warning("session %s: %s%s", job.session_id, problem, "" if now else "; tearing down immediately")
        return problem

    def _result(self, job: SessionJob, status: TrajectoryStatus, error: str | None) -> SessionResult:
        built, outcome, evaluation = job.built, job.outcome, job.evaluation
        trajectory = built.trajectory if built is not None else Trajectory(status=status)
        trajectory = trajectory.model_copy(update={"status": status, "session_id": job.session_id, "error": error})
        reward_to = job.task.evaluator.reward_to if job.task is not None else DEFAULT_REWARD_TO
        reward = evaluation.reward if evaluation is not None else None
        shaping = job.task.evaluator.shaping if job.task is not None else None
        shaped = None
        if shaping is not None:  # the recorded reward is the shaped one (polar_cli/trainers/shaping.py says why)
            sampled = sum(len(c.response_ids) for c in job.completions or [])
            shaped = shape_reward(reward, status, sampled, shaping)
            trajectory, reward = shape_trajectory(trajectory, shaped), shaped.reward
        trajectory = assign_rewards(trajectory, reward, reward_to)
        metadata = dict(job.metadata)
        if outcome is not None:
            metadata["run_status"] = outcome.status
            if outcome.details:
                metadata["run"] = outcome.details
        if evaluation is not None and evaluation.details:
            metadata["evaluation"] = evaluation.details
        return SessionResult(
            session_id=job.session_id,
            task_id=job.task_id,
            sample_index=job.sample_index,
            status=status,
            trajectory=trajectory,
            reward=reward,
            shaping=shaped,
            num_completions=len(job.completions) if job.completions is not None else 0,
            stage_seconds=job.stage_seconds(),
            error=error,
            harness_stderr=outcome.stderr if outcome is not None else None,
            metadata=metadata,
        )

    async def _publish(self, job: SessionJob, result: SessionResult) -> None:
        """Store the result durably, then tell waiters and callbacks (never the other way round)."""
        if self.store is not None:
            try:
                await asyncio.to_thread(self.store.write, result)
            except Exception as exc:  # the caller still gets the result; the loss is on record
                log.error("session %s: result not persisted: %s", job.session_id, describe(exc))
                result = result.model_copy(update={"metadata": {**result.metadata, "persist_error": describe(exc)}})
        job.result = result
        job.stage = Stage.FINISHED
        self._statuses[result.status] += 1
        self.exported.session_finished(result.stage_seconds)
        self._active.pop(job.session_id, None)
        self._finished[job.session_id] = job
        while len(self._finished) > self.config.keep_finished:
            self._finished.popitem(last=False)
        job.done.set()
        for callback in self._callbacks:
            self._spawn(self._notify(callback, result))

    async def _notify(self, callback: ResultCallback, result: SessionResult) -> None:
        try:
            outcome = callback(result)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            log.exception("session %s: result callback failed", result.session_id)
