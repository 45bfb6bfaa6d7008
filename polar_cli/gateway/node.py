"""A gateway node's lifecycle and Python API: the proxy, the staged pipeline and the result store in one process.

``async with GatewayNode(config) as node:`` checks the backend (``config.backend_check``), removes what an earlier run
of the same node left in its runtimes (``polar_cli.gateway.sweeps``; the TTL sweep then runs in the background),
serves the node's routes (``polar_cli.gateway.app``) and runs the pipeline until it is closed. ``node.node_id`` labels
every runtime its sessions start: the rollout server's node id, or for a node no server names, one derived from
the data dir. ``node.submit(...)`` and
``node.submit_batch(...)`` are what the routes call; ``node.run_task(task)`` runs a whole task in-process.

The inference pool (``node.proxy.pool``) is driven through the node too: ``inference()``, ``pause``, ``resume``,
``load_weights``, ``add_backend``, ``remove_backend``, ``sync_inference`` (the server's state, at register) and
``cancel_stale``. Whenever the policy version changes, the running sessions of tasks with ``max_staleness`` that fell
too far behind are cancelled with status ``stale`` (``polar_cli.gateway.staleness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path

from polar_cli.errors import BackendError, ConfigError, PolarError, SessionError
from polar_cli.gateway import staleness
from polar_cli.gateway.app import PROXY_PREFIX, create_app
from polar_cli.gateway.backend_check import check_backend
from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.jobs import SessionBudget, SessionJob, Stage
from polar_cli.gateway.pipeline import ResultCallback, StagedPipeline
from polar_cli.gateway.results import ResultStore
from polar_cli.gateway.session_driver import FRESH_SUFFIX, GatewaySessionDriver
from polar_cli.gateway.sweeps import RuntimeSweeps, local_node_id
from polar_cli.ids import session_id_for
from polar_cli.metrics import Exposition, GatewayMetrics
from polar_cli.models import SessionResult, TaskRequest, validate_model
from polar_cli.models.inference import PauseMode, PoolStatus
from polar_cli.models.task import without_script
from polar_cli.node_protocol import ATTEMPT_KEY, PAUSE_TIMEOUT_S, BatchSessionAnswer, SessionBatch, SessionInfo
from polar_cli.proxy import ProxyState, session_options
from polar_cli.runtimes.pool import SandboxPool, SandboxRecipe
from polar_cli.task_check import check_task
from polar_cli.web.errors import status_for
from polar_cli.web.listen import Listener, listen, with_port

log = logging.getLogger(__name__)


class GatewayNode:
    """``async with GatewayNode(config) as node:`` serves; ``await node.run_task(task)`` runs one task in-process."""

    def __init__(
        self,
        config: GatewayConfig | None = None,
        *,
        proxy: ProxyState | None = None,
        base_dir: Path | None = None,
        on_result: Iterable[ResultCallback] = (),
        node_id: str | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self.proxy = proxy or ProxyState(self.config.proxy_config())
        self.store = ResultStore(self.config.results_dir)
        self._node_id = node_id or local_node_id(self.config.data_dir)
        self.sandboxes = SandboxPool(self.config.pipeline.sandbox_pool, demand=self._init_demand)
        """Warm sandboxes INIT takes (``pipeline.sandbox_pool``; off by default)."""
        self.driver = GatewaySessionDriver(self.proxy, scratch_root=self.config.scratch_root, base_dir=base_dir,
                                           node_id=self._node_id, pool=self.sandboxes)  # fmt: skip
        self.sweeps = RuntimeSweeps(self.config.runtime_gc, node_id=lambda: self.node_id, held=self._held,
                                    scratch_root=self.config.scratch_root)  # fmt: skip
        self.metrics = GatewayMetrics(self.proxy.metrics.registry)
        self.metrics.watch_sandboxes(self.sandboxes.snapshot)
        """The node's one registry holds its proxy's metrics and its pipeline's (``GET /metrics``)."""
        self.pipeline = StagedPipeline(self.driver, self.config.pipeline, store=self.store, on_result=on_result,
                                       metrics=self.metrics)  # fmt: skip
        self.url: str | None = None
        self._listener: Listener | None = None
        self._stale: set[asyncio.Task[SessionResult | None]] = set()  # cancellations of stale sessions under way

    @property
    def node_id(self) -> str:
        """The node id every runtime of this node is labelled with."""
        return self._node_id

    @node_id.setter
    def node_id(self, value: str) -> None:
        self._node_id = self.driver.node_id = value

    def _held(self) -> list[str]:
        """The session ids whose runtimes are live here (a session's evaluation runtime included), and the pool ids
        of the warm pool's sandboxes."""
        sessions = [sid for job in self.pipeline.active() for sid in (job.session_id, job.session_id + FRESH_SUFFIX)]
        return sessions + self.sandboxes.held()

    @property
    def draining(self) -> bool:
        """Set when the node is stopping gracefully: ``POST /sessions`` answers 503, sessions under way finish (a run
        that fails meanwhile is handed back: ``StagedPipeline.stopping``)."""
        return self.pipeline.stopping

    @draining.setter
    def draining(self, value: bool) -> None:
        self.pipeline.stopping = value

    @property
    def exposition(self) -> Exposition:
        """What ``GET /metrics`` renders (and a separate metrics bind, ``polar serve --metrics-port``)."""
        return Exposition(self.metrics.registry)

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.config.backend_check != "off":
            try:
                await check_backend(self.proxy.backend, wait_s=self.proxy.config.backend_check_timeout_s,
                                    token_in=self.proxy.config.token_mode == "tokens")  # fmt: skip
            except BackendError as exc:
                if self.config.backend_check == "fail":
                    raise
                log.error("%s (sessions fail until it answers)", exc)
        await self.sweeps.at_start()  # before any session: nothing of this run can be taken for a leftover
        self._listener = await listen(create_app(self), self.config.host, self.config.port)
        public = self.config.public_url
        self.url = (with_port(public, self._listener.port) if public else self._listener.url).rstrip("/")
        self.proxy.base_url = self.url + PROXY_PREFIX
        await self.sandboxes.start()
        await self.pipeline.start()
        self.sweeps.start()

    async def close(self) -> None:
        """Cancel what is in flight (each session still gets its result), then stop serving."""
        await self.sweeps.close()
        await self.pipeline.close()
        await asyncio.gather(*self._stale, return_exceptions=True)  # the pipeline concluded their sessions
        await self.sandboxes.close()  # every pooled sandbox stopped
        if self._listener is not None:
            await self._listener.close()  # closes the proxy (its cleanup hook) too
            self._listener = None

    async def __aenter__(self) -> GatewayNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _init_demand(self) -> Iterator[SandboxRecipe]:
        """A sandbox recipe per session waiting for an INIT worker: what sizes the sandbox pool."""
        for job in self.pipeline.active():
            if job.stage is Stage.INIT_QUEUED and job.task is not None:
                with contextlib.suppress(PolarError):  # e.g. a harness not installed: its INIT will say so
                    yield self.driver.recipe(job.task)

    # ---- Python API ---------------------------------------------------------------------------------------------

    def job_for(
        self, task: TaskRequest, sample_index: int = 0, session_id: str | None = None, attempt: int | None = None
    ) -> SessionJob:
        metadata = without_script(task.metadata)
        if attempt is not None:
            metadata[ATTEMPT_KEY] = attempt  # the result says which attempt it is (the agent reports it so)
        return SessionJob(
            session_id=session_id or session_id_for(task.task_id, sample_index),
            budget=SessionBudget.for_task(task, self.config.pipeline),
            task=task,
            sample_index=sample_index,
            metadata=metadata,
            attempt=attempt,
        )

    def check(self, task: TaskRequest) -> None:
        """ConfigError (400) unless ``task`` can run here: its own checks, and what its sessions pass to the proxy's
        backend (``metadata.script`` only as an inline list: never a path)."""
        check_task(task)
        session_options(self.proxy.backend, task.metadata, None)

    async def submit(
        self, task: TaskRequest, sample_index: int = 0, session_id: str | None = None, *, attempt: int | None = None
    ) -> SessionJob:
        self.check(task)
        return await self._submit_checked(task, sample_index, session_id, attempt)

    async def _submit_checked(
        self, task: TaskRequest, sample_index: int, session_id: str | None, attempt: int | None
    ) -> SessionJob:
        if session_id is not None and self._is_new_attempt(session_id, attempt):
            self.pipeline.forget(session_id)  # the rollout server runs a session that ended here once more
        return await self.pipeline.submit(self.job_for(task, sample_index, session_id, attempt))

    def _is_new_attempt(self, session_id: str, attempt: int | None) -> bool:
        """The session ended here, and ``attempt`` is later than the attempt it ran as."""
        try:
            previous = self.pipeline.get(session_id)
        except SessionError:
            return False
        before = previous.attempt
        return previous.result is not None and before is not None and attempt is not None and attempt > before

    async def submit_task(self, task: TaskRequest) -> list[SessionJob]:
        """All ``num_samples`` sessions of ``task``."""
        self.check(task)
        return [await self.pipeline.submit(self.job_for(task, i)) for i in range(task.num_samples)]

    async def run_task(self, task: TaskRequest) -> list[SessionResult]:
        jobs = await self.submit_task(task)
        return [await self.pipeline.wait(job.session_id) for job in jobs]

    def describe(self, session_id: str) -> SessionInfo:
        """Where the session is (``GET /sessions/{id}``); SessionError when this node does not know it."""
        try:
            job = self.pipeline.get(session_id)
        except SessionError:
            result = self.store.read(session_id)  # SessionError when unknown here too
            return SessionInfo(session_id=session_id, stage="finished", result=result)
        info = SessionInfo(session_id=session_id, task_id=job.task_id, sample_index=job.sample_index,
                           stage=str(job.stage), stage_seconds=job.stage_seconds())  # fmt: skip
        if job.result is not None:
            info.result = job.result  # set only when there is one: the answer has no "result" key before
        return info

    async def submit_batch(self, batch: SessionBatch) -> list[BatchSessionAnswer]:
        """Each session of ``batch`` as ``POST /sessions`` would create it; a refused one does not stop the others.
        Each task is validated and checked once."""
        tasks: dict[str, TaskRequest | Exception] = {}
        for task_id, body in batch.tasks.items():
            try:
                task = validate_model(TaskRequest, body, source=f"POST /sessions/batch: task {task_id!r}")
                if task.task_id != task_id:
                    raise ConfigError(f"tasks[{task_id!r}] has task_id {task.task_id!r}")
                self.check(task)
                tasks[task_id] = task
            except Exception as exc:  # the sessions of this task are refused with it; the others go on
                tasks[task_id] = exc
        answers = []
        for spec in batch.sessions:
            task_or_error = tasks.get(spec.task_id) or ConfigError(f"task {spec.task_id!r} is not in the batch")
            try:
                if isinstance(task_or_error, Exception):
                    raise task_or_error
                await self._submit_checked(task_or_error, spec.sample_index, spec.session_id, spec.attempt)
            except Exception as exc:
                answers.append(BatchSessionAnswer(session_id=spec.session_id, accepted=False, status=status_for(exc),
                                                  error=str(exc)[:500]))  # fmt: skip
            else:
                answers.append(BatchSessionAnswer(session_id=spec.session_id, accepted=True, status=201))
        return answers

    # ---- the inference pool (issue 20) --------------------------------------------------------------------------

    def inference(self) -> PoolStatus:
        """``GET /inference``: the pool's version, pause state and replicas."""
        return self.proxy.pool.status()

    async def pause(self, mode: PauseMode = "wait", timeout_s: float = PAUSE_TIMEOUT_S) -> PoolStatus:
        """Hold new model calls at the proxy (PauseTimeout, 409, naming what it waited for; the pool stays paused)."""
        return await self.proxy.pool.pause(mode, timeout_s)

    async def resume(self, policy_version: int | None = None) -> PoolStatus:
        """Calls held go on under ``policy_version`` (None: the current one + 1); stale sessions are cancelled."""
        return await self._versioned(lambda: self.proxy.pool.resume(policy_version))

    async def load_weights(
        self,
        path: str,
        *,
        policy_version: int | None = None,
        timeout_s: float = PAUSE_TIMEOUT_S,
        urls: Sequence[str] | None = None,
    ) -> PoolStatus:
        """Pause, reload every replica (or ``urls``) from ``path``, resume under ``policy_version``; stale sessions are
        cancelled."""
        return await self._versioned(
            lambda: self.proxy.pool.load_weights(path, policy_version=policy_version, timeout_s=timeout_s, urls=urls)
        )

    async def sync_inference(self, policy_version: int, paused: PauseMode | None) -> PoolStatus:
        """Take on the rollout server's version and pause state (at register); stale sessions are cancelled."""
        return await self._versioned(lambda: self.proxy.pool.sync(policy_version, paused))

    async def add_backend(self, url: str) -> PoolStatus:
        return await self.proxy.pool.add(url)

    async def remove_backend(self, url: str, timeout_s: float = PAUSE_TIMEOUT_S) -> PoolStatus:
        """Drain the replica (its calls in flight finish), then drop it."""
        return await self.proxy.pool.remove(url, timeout_s)

    async def cancel_stale(self, older_than: int | None = None) -> list[str]:
        """Cancel (status ``stale``) every running session whose oldest completion's version is below ``older_than``
        (default: the current version); the ids of those that ended ``stale``, once their results are stored."""
        threshold = self.proxy.pool.policy_version if older_than is None else older_than
        reasons = self._judge(lambda job, oldest: staleness.older_than(oldest, threshold))
        results = await asyncio.gather(*self._cancel_stale(reasons))
        return [r.session_id for r in results if r is not None and r.status == "stale"]

    async def _versioned(self, change: Callable[[], Awaitable[PoolStatus]]) -> PoolStatus:
        """``change`` the pool; when it moved the version on, cancel the sessions now over their ``max_staleness``
        (in the background: the answer does not wait for their teardown)."""
        before = self.proxy.pool.policy_version
        status = await change()
        if status.policy_version != before:
            current = status.policy_version

            def over(job: SessionJob, oldest: int | None) -> str | None:
                return staleness.over_max_staleness(oldest, current, _max_staleness(job))

            self._cancel_stale(self._judge(over, only=lambda job: _max_staleness(job) is not None))
        return status

    def _judge(
        self, rule: Callable[[SessionJob, int | None], str | None], only: Callable[[SessionJob], bool] = lambda j: True
    ) -> dict[str, str]:
        """Why ``rule`` finds each running session (those ``only`` keeps) stale, given the version of its oldest
        completion; the sessions it does not find stale are left out."""
        reasons = {}
        for job in self.pipeline.active():
            if job.stage is not Stage.RUNNING or job.cancel_requested or not only(job):
                continue
            try:
                oldest = self.proxy.registry.get(job.session_id).oldest_version
            except SessionError:  # its proxy session is closed: the run is ending
                continue
            reason = rule(job, oldest)
            if reason is not None:
                reasons[job.session_id] = reason
        return reasons

    def _cancel_stale(self, reasons: dict[str, str]) -> list[asyncio.Task[SessionResult | None]]:
        """Cancel each session with status ``stale`` and its reason, each in a task of its own."""
        tasks = []
        for session_id, reason in reasons.items():
            log.info("session %s: %s", session_id, reason)
            task = asyncio.create_task(self._cancel_one(session_id, reason))
            self._stale.add(task)
            task.add_done_callback(self._stale.discard)
            tasks.append(task)
        return tasks

    async def _cancel_one(self, session_id: str, reason: str) -> SessionResult | None:
        try:
            return await self.pipeline.cancel(session_id, reason, status="stale")
        except SessionError:  # forgotten meanwhile (a new attempt of it came in)
            return None


def _max_staleness(job: SessionJob) -> int | None:
    return job.task.max_staleness if job.task is not None else None
