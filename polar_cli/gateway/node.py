"""A gateway node: the proxy, the staged pipeline and the result store in one process, behind one HTTP server.

Every route but ``/healthz`` and the sessions' own ``/proxy/s/{id}`` needs ``Authorization: Bearer <control_token>``
(the config's, generated when none is given; the command layer prints it):

| route | what |
|---|---|
| ``POST /sessions`` | ``{task: TaskRequest, sample_index?, session_id?}``: one full session → 201 ``{session_id}`` |
| ``POST /sessions/batch`` | ``{tasks: {task_id: TaskRequest}, sessions: [{task_id, sample_index, session_id, \
attempt?}]}``: many sessions, each task once → 200 ``{sessions: [{session_id, accepted, status, error?}]}`` |
| ``GET /sessions/{id}`` | ``{session_id, stage, stage_seconds, result?}`` (finished ones also from the result store) |
| ``GET /sessions/{id}/result`` | the SessionResult, once stored (``?wait=SECONDS`` long-polls); 202 while running |
| ``DELETE /sessions/{id}`` | cancel: the runtime is torn down at once; answers the (``cancelled``) SessionResult |
| ``GET /metrics`` | queue depth, in-flight and capacity per stage, session counts, run-slot utilization |
| ``GET /healthz`` | ``{ok}``, open |
| ``/proxy/...`` | the proxy (its own ``/proxy/sessions`` control routes and every session's ``/proxy/s/{id}``) |

While the node drains (a graceful stop), ``POST /sessions`` and ``POST /sessions/batch`` answer 503 and the sessions
under way run to the end. In a batch, each session's ``status`` is what ``POST /sessions`` would have answered for it
alone; a refused session does not stop the others.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import Field, field_validator

from polar_cli.errors import BackendError, ConfigError, SessionError
from polar_cli.gateway.config import PipelineConfig
from polar_cli.gateway.jobs import SessionBudget, SessionJob
from polar_cli.gateway.pipeline import ResultCallback, StagedPipeline
from polar_cli.gateway.results import ResultStore
from polar_cli.gateway.session_driver import GatewaySessionDriver, check_task
from polar_cli.ids import SessionId, check_session_id, id_part
from polar_cli.models import SessionResult, StrictModel, TaskRequest, validate_model
from polar_cli.models.service import ATTEMPT_KEY, BatchSessionAnswer, SessionBatch, SessionBatchAnswer
from polar_cli.proxy import ProxyConfig, ProxyState, create_proxy_app, proxy_error_shape, session_options
from polar_cli.web.auth import guarded, new_token
from polar_cli.web.body import read_json
from polar_cli.web.errors import ERROR_SHAPE, error_response, json_errors, json_response, status_for
from polar_cli.web.listen import Listener, listen

PROXY_PREFIX = "/proxy"
BACKEND_CHECK_S = 5.0
"""How long the start-up check of the backend waits for its answer."""

log = logging.getLogger(__name__)


class GatewayConfig(StrictModel):
    """One gateway node: where it listens, where it keeps data, its pools and its proxy's backend."""

    host: str = "127.0.0.1"
    port: int = Field(default=8790, ge=0, le=65535)
    public_url: str | None = Field(default=None, description="the node's URL as runtimes reach it (default: listen)")
    data_dir: Path = Field(default=Path("polar-data"), description="results/ and journal/ go here")
    scratch_root: Path | None = Field(default=None, description="runtimes' per-session host dirs (default: $TMPDIR)")
    control_token: str = Field(
        default_factory=new_token, description="Bearer token of every control route (the proxy's too); generated"
    )
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig, description="backend options; host/port are not used")
    backend_check: Literal["fail", "warn", "off"] = Field(
        default="warn",
        description="at start-up, ask the backend once (GET /v1/models, BACKEND_CHECK_S seconds, no retries): fail "
        "(polar run, polar generate: an unreachable backend stops before any session), warn (log it and serve: "
        "the inference server may still be loading), off",
    )

    @field_validator("control_token", mode="before")
    @classmethod
    def _token(cls, value: Any) -> Any:
        return value or new_token()  # never open: a missing token is a generated one

    def proxy_config(self) -> ProxyConfig:
        journal = self.proxy.journal_dir or self.data_dir / "journal"
        return self.proxy.model_copy(update={"journal_dir": journal, "control_token": self.control_token})


class SessionCreate(StrictModel):
    """Body of ``POST /sessions``: one session (one sample) of a task."""

    task: TaskRequest
    sample_index: int = Field(default=0, ge=0)
    session_id: SessionId | None = None


def session_id_for(task_id: str, sample_index: int) -> str:
    """``<task id, made safe>-<sample>-<random>``: readable and unique."""
    slug = id_part(task_id) or "task"
    return f"{slug}-{sample_index}-{secrets.token_hex(4)}"


class GatewayNode:
    """``async with GatewayNode(config) as node:`` serves; ``await node.run_task(task)`` runs one task in-process."""

    def __init__(
        self,
        config: GatewayConfig | None = None,
        *,
        proxy: ProxyState | None = None,
        base_dir: Path | None = None,
        on_result: Iterable[ResultCallback] = (),
    ) -> None:
        self.config = config or GatewayConfig()
        self.proxy = proxy or ProxyState(self.config.proxy_config())
        self.store = ResultStore(self.config.data_dir / "results")
        self.driver = GatewaySessionDriver(self.proxy, scratch_root=self.config.scratch_root, base_dir=base_dir)
        self.pipeline = StagedPipeline(self.driver, self.config.pipeline, store=self.store, on_result=on_result)
        self.url: str | None = None
        self.draining = False
        """Set when the node is stopping gracefully: ``POST /sessions`` answers 503, sessions under way finish."""
        self._listener: Listener | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.config.backend_check != "off":
            try:
                await self.proxy.backend.preflight(BACKEND_CHECK_S)
            except BackendError as exc:
                if self.config.backend_check == "fail":
                    raise
                log.error("%s (sessions fail until it answers)", exc)
        self._listener = await listen(self.create_app(), self.config.host, self.config.port)
        self.url = (self.config.public_url or self._listener.url).rstrip("/")
        self.proxy.base_url = self.url + PROXY_PREFIX
        await self.pipeline.start()

    async def close(self) -> None:
        """Cancel what is in flight (each session still gets its result), then stop serving."""
        await self.pipeline.close()
        if self._listener is not None:
            await self._listener.close()  # closes the proxy (its cleanup hook) too
            self._listener = None

    async def __aenter__(self) -> GatewayNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- Python API ---------------------------------------------------------------------------------------------

    def job_for(self, task: TaskRequest, sample_index: int = 0, session_id: str | None = None) -> SessionJob:
        return SessionJob(
            session_id=session_id or session_id_for(task.task_id, sample_index),
            budget=SessionBudget.for_task(task, self.config.pipeline),
            task=task,
            sample_index=sample_index,
            metadata={k: v for k, v in task.metadata.items() if k != "script"},
        )

    def check(self, task: TaskRequest) -> None:
        """ConfigError (400) unless ``task`` can run here: its own checks, and what its sessions pass to the proxy's
        backend (``metadata.script`` only as an inline list: never a path)."""
        check_task(task)
        session_options(self.proxy.backend, task.metadata, None)

    async def submit(self, task: TaskRequest, sample_index: int = 0, session_id: str | None = None) -> SessionJob:
        self.check(task)
        if session_id is not None and self._is_new_attempt(session_id, task):
            self.pipeline.forget(session_id)  # the rollout server runs a session that ended here once more
        return await self.pipeline.submit(self.job_for(task, sample_index, session_id))

    def _is_new_attempt(self, session_id: str, task: TaskRequest) -> bool:
        """The session ended here, and ``task`` carries a later attempt number (``polar_attempt``) than it did."""
        try:
            previous = self.pipeline.get(session_id)
        except SessionError:
            return False
        before, now = previous.metadata.get(ATTEMPT_KEY), task.metadata.get(ATTEMPT_KEY)
        return previous.result is not None and isinstance(before, int) and isinstance(now, int) and now > before

    async def submit_task(self, task: TaskRequest) -> list[SessionJob]:
        """All ``num_samples`` sessions of ``task``."""
        self.check(task)
        return [await self.pipeline.submit(self.job_for(task, i)) for i in range(task.num_samples)]

    async def run_task(self, task: TaskRequest) -> list[SessionResult]:
        jobs = await self.submit_task(task)
        return [await self.pipeline.wait(job.session_id) for job in jobs]

    def describe(self, session_id: str) -> dict[str, Any]:
        try:
            job = self.pipeline.get(session_id)
        except SessionError:
            result = self.store.read(session_id)  # SessionError when unknown here too
            return {"session_id": session_id, "stage": "finished", "result": result.model_dump(mode="json")}
        out: dict[str, Any] = {"session_id": session_id, "task_id": job.task_id, "sample_index": job.sample_index,
                               "stage": str(job.stage), "stage_seconds": job.stage_seconds()}  # fmt: skip
        if job.result is not None:
            out["result"] = job.result.model_dump(mode="json")
        return out

    # ---- HTTP ---------------------------------------------------------------------------------------------------

    def create_app(self) -> web.Application:
        app = web.Application(
            client_max_size=int(self.proxy.config.max_body_mb * 1024 * 1024), middlewares=[json_errors(what="gateway")]
        )
        guard = self._guard
        app.router.add_post("/sessions", guard(self._create))
        app.router.add_post("/sessions/batch", guard(self._create_batch))
        app.router.add_get("/sessions/{session_id}", guard(self._get))
        app.router.add_get("/sessions/{session_id}/result", guard(self._result))
        app.router.add_delete("/sessions/{session_id}", guard(self._cancel))
        app.router.add_get("/metrics", guard(self._metrics))
        app.router.add_get("/healthz", self._health)
        app[ERROR_SHAPE] = proxy_error_shape(PROXY_PREFIX)
        app.add_subapp(PROXY_PREFIX, create_proxy_app(self.proxy.config, self.proxy, mount=PROXY_PREFIX))
        return app

    def _guard(self, handler: Callable[[web.Request], Awaitable[web.Response]]) -> Any:
        return guarded(self.config.control_token, "the gateway's control routes", handler)

    async def _create(self, request: web.Request) -> web.Response:
        if self.draining:
            return error_response(503, "the gateway is draining: it takes no new sessions")
        data = await read_json(request, source="POST /sessions")
        spec = validate_model(SessionCreate, data, source="POST /sessions")
        job = await self.submit(spec.task, spec.sample_index, spec.session_id)
        return json_response({"session_id": job.session_id, "task_id": job.task_id, "sample_index": job.sample_index,
                      "stage": str(job.stage)}, 201)  # fmt: skip

    async def _create_batch(self, request: web.Request) -> web.Response:
        if self.draining:
            return error_response(503, "the gateway is draining: it takes no new sessions")
        source = "POST /sessions/batch"
        batch = validate_model(SessionBatch, await read_json(request, source=source), source=source)
        answer = SessionBatchAnswer(sessions=await self.submit_batch(batch))
        return json_response(answer.model_dump(mode="json"))

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
                task = task_or_error
                if spec.attempt is not None:
                    task = task.model_copy(update={"metadata": {**task.metadata, ATTEMPT_KEY: spec.attempt}})
                if self._is_new_attempt(spec.session_id, task):
                    self.pipeline.forget(spec.session_id)
                await self.pipeline.submit(self.job_for(task, spec.sample_index, spec.session_id))
            except Exception as exc:
                answers.append(BatchSessionAnswer(session_id=spec.session_id, accepted=False, status=status_for(exc),
                                                  error=str(exc)[:500]))  # fmt: skip
            else:
                answers.append(BatchSessionAnswer(session_id=spec.session_id, accepted=True, status=201))
        return answers

    async def _get(self, request: web.Request) -> web.Response:
        return json_response(self.describe(check_session_id(request.match_info["session_id"])))

    async def _result(self, request: web.Request) -> web.Response:
        session_id = check_session_id(request.match_info["session_id"])
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError as exc:
            raise ConfigError("wait must be a number of seconds") from exc
        try:
            result = await asyncio.wait_for(self.pipeline.wait(session_id), timeout=max(wait, 0.0) or 0.001)
        except TimeoutError:
            return json_response({"session_id": session_id, "stage": str(self.pipeline.get(session_id).stage)}, 202)
        return json_response(result.model_dump(mode="json"))

    async def _cancel(self, request: web.Request) -> web.Response:
        result = await self.pipeline.cancel(check_session_id(request.match_info["session_id"]))
        return json_response(result.model_dump(mode="json"))

    async def _metrics(self, request: web.Request) -> web.Response:
        return json_response(self.pipeline.metrics())

    async def _health(self, request: web.Request) -> web.Response:
        return json_response({"ok": True})  # open, so it tells nothing about sessions


ProgressCallback = Callable[[dict[str, Any], list[SessionResult]], None]


async def run_embedded(
    task: TaskRequest,
    config: GatewayConfig,
    *,
    base_dir: Path | None = None,
    on_progress: ProgressCallback | None = None,
    on_ready: Callable[[GatewayNode], None] | None = None,
    interval: float = 0.2,
) -> list[SessionResult]:
    """Run every session of ``task`` on a gateway node started for it (``polar run``); results in sample order.

    ``on_ready(node)`` is called once it listens (``node.url``; its control routes need ``config.control_token``);
    ``on_progress(metrics, finished_results)`` is called every ``interval`` seconds and once at the end (also when
    cancelled, with every session's result once the node has cancelled them).
    """
    async with GatewayNode(config, base_dir=base_dir) as node:
        if on_ready is not None:
            on_ready(node)
        jobs = await node.submit_task(task)
        waiting = asyncio.gather(*(node.pipeline.wait(job.session_id) for job in jobs))
        try:
            while not waiting.done():
                if on_progress is not None:
                    on_progress(node.pipeline.metrics(), [job.result for job in jobs if job.result is not None])
                await asyncio.wait({waiting}, timeout=interval)
        except BaseException:  # cancelled (Ctrl-C, SIGTERM): each session is cancelled and still gets its result
            waiting.cancel()
            await node.close()
            if on_progress is not None:
                on_progress(node.pipeline.metrics(), [job.result for job in jobs if job.result is not None])
            raise
        results = waiting.result()
        if on_progress is not None:
            on_progress(node.pipeline.metrics(), results)
        return results
