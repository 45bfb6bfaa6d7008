"""A gateway node's HTTP routes (the node side of ``polar_cli.node_protocol``): parse and check each call, then one
GatewayNode method.

Every route but ``/healthz`` and the sessions' own ``/proxy/s/{id}`` needs ``Authorization: Bearer <control_token>``
(the config's, generated when none is given; the command layer prints it):

| route | what |
|---|---|
| ``POST /sessions`` | ``SingleSession``: one full session → 201 ``SessionCreated`` |
| ``POST /sessions/batch`` | ``SessionBatch`` (each task once, then the sessions) → 200 ``SessionBatchAnswer`` |
| ``GET /sessions/{id}`` | ``SessionInfo``: stage, stage seconds, the result once there (also from the result store) |
| ``GET /sessions/{id}/result`` | the SessionResult, once stored (``?wait=SECONDS`` long-polls); 202 while running |
| ``DELETE /sessions/{id}`` | cancel: the runtime is torn down at once; answers the (``cancelled``) SessionResult |
| ``GET /metrics`` | Prometheus text: the pipeline, the proxy and the inference pool (``polar_cli.metrics``) |
| ``GET /metrics.json`` | ``StagedPipeline.metrics()``: per-stage queued, in flight and capacity; sessions; run slots |
| ``GET /inference`` | the inference pool: ``PoolStatus`` (version, pause state, replicas) |
| ``POST /inference/pause`` | ``PauseBody`` → ``PoolStatus`` once quiet (``wait``); 409 naming what it waited for |
| ``POST /inference/resume`` | ``ResumeBody`` → ``PoolStatus``; sessions over their ``max_staleness`` end ``stale`` |
| ``POST /inference/load_weights`` | ``LoadWeightsBody`` → ``PoolStatus`` (pause, reload, resume; stale as above) |
| ``POST /inference/backends`` | ``BackendBody`` → ``PoolStatus``: a replica added |
| ``DELETE /inference/backends`` | ``BackendBody`` (JSON body) → ``PoolStatus``: a replica drained, then removed |
| ``POST /inference/cancel_stale`` | ``CancelStaleBody`` → ``CancelStaleAnswer``: the sessions that ended ``stale`` |
| ``GET /healthz`` | ``{ok}``, open |
| ``/proxy/...`` | the proxy (its own ``/proxy/sessions`` control routes and every session's ``/proxy/s/{id}``) |

While the node drains (a graceful stop), ``POST /sessions`` and ``POST /sessions/batch`` answer 503 and the sessions
under way run to the end. In a batch, each session's ``status`` is what ``POST /sessions`` would have answered for it
alone; a refused session does not stop the others. The ``/inference`` routes are the rollout server's (a trainer
talks to the server, which tells every gateway); a body whose fields are all optional may be empty. ``load_weights``
on a pool with a replica that cannot reload (the scripted backend) is a 409 before anything is paused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from pydantic import BaseModel

from polar_cli.aio import within
from polar_cli.errors import ConfigError
from polar_cli.ids import check_session_id
from polar_cli.models import validate_model
from polar_cli.models.limits import MAX_CONTROL_BODY_BYTES, MAX_TASK_BODY_BYTES
from polar_cli.node_protocol import (
    BackendBody,
    CancelStaleAnswer,
    CancelStaleBody,
    LoadWeightsBody,
    PauseBody,
    ResumeBody,
    SessionBatch,
    SessionBatchAnswer,
    SessionCreated,
    SingleSession,
)
from polar_cli.proxy import create_proxy_app, proxy_error_shape
from polar_cli.web.auth import guarded
from polar_cli.web.body import read_json
from polar_cli.web.errors import ERROR_SHAPE, Handler, error_response, json_errors, json_response
from polar_cli.web.intake import intake
from polar_cli.web.metrics import metrics_handler

if TYPE_CHECKING:
    from polar_cli.gateway.node import GatewayNode

PROXY_PREFIX = "/proxy"

DRAINING = "the gateway is draining: it takes no new sessions"


B = TypeVar("B", bound=BaseModel)


def _json(model: BaseModel, status: int = 200) -> web.Response:
    return json_response(model.model_dump(mode="json"), status)


async def _body(request: web.Request, model: type[B]) -> B:
    """An ``/inference`` route's body (at most ``MAX_CONTROL_BODY_BYTES``, else a 413) as ``model`` (400 naming the
    field); an empty body is ``{}`` for models without a required field."""
    source = f"{request.method} {request.path}"
    empty: dict[str, object] | None = {} if not any(f.is_required() for f in model.model_fields.values()) else None
    data = await read_json(request, source=source, default=empty, limit=MAX_CONTROL_BODY_BYTES)
    return validate_model(model, data, source=source)


def create_app(node: GatewayNode) -> web.Application:
    """The node's routes, with the proxy mounted under ``/proxy``."""
    app = web.Application(
        client_max_size=int(node.proxy.config.max_body_mb * 1024 * 1024),
        middlewares=[intake, json_errors(what="gateway")],
    )

    def guard(handler: Handler) -> Handler:
        return guarded(node.config.control_token, "the gateway's control routes", handler)

    async def create(request: web.Request) -> web.Response:
        if node.draining:
            return error_response(503, DRAINING)
        data = await read_json(request, source="POST /sessions", limit=MAX_TASK_BODY_BYTES)
        spec = validate_model(SingleSession, data, source="POST /sessions")
        job = await node.submit(spec.task, spec.sample_index, spec.session_id, attempt=spec.attempt)
        created = SessionCreated(session_id=job.session_id, task_id=job.task_id, sample_index=job.sample_index,
                                 stage=str(job.stage))  # fmt: skip
        return _json(created, 201)

    async def create_batch(request: web.Request) -> web.Response:
        if node.draining:
            return error_response(503, DRAINING)
        source = "POST /sessions/batch"
        data = await read_json(request, source=source, limit=MAX_TASK_BODY_BYTES)
        batch = validate_model(SessionBatch, data, source=source)
        return _json(SessionBatchAnswer(sessions=await node.submit_batch(batch)))

    async def describe(request: web.Request) -> web.Response:
        info = node.describe(check_session_id(request.match_info["session_id"]))
        return json_response(info.model_dump(mode="json", exclude_unset=True))

    async def result(request: web.Request) -> web.Response:
        session_id = check_session_id(request.match_info["session_id"])
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError as exc:
            raise ConfigError("wait must be a number of seconds") from exc
        try:
            found = await within(node.pipeline.wait(session_id), max(wait, 0.0) or 0.001)
        except TimeoutError:
            return json_response({"session_id": session_id, "stage": str(node.pipeline.get(session_id).stage)}, 202)
        return _json(found)

    async def cancel(request: web.Request) -> web.Response:
        return _json(await node.pipeline.cancel(check_session_id(request.match_info["session_id"])))

    async def pipeline_metrics(request: web.Request) -> web.Response:
        return json_response(node.pipeline.metrics())

    async def inference(request: web.Request) -> web.Response:
        return _json(node.inference())

    async def pause(request: web.Request) -> web.Response:
        body = await _body(request, PauseBody)
        return _json(await node.pause(body.mode, body.timeout_s))

    async def resume(request: web.Request) -> web.Response:
        body = await _body(request, ResumeBody)
        return _json(await node.resume(body.policy_version))

    async def load_weights(request: web.Request) -> web.Response:
        body = await _body(request, LoadWeightsBody)
        status = await node.load_weights(body.path, policy_version=body.policy_version, timeout_s=body.timeout_s,
                                         urls=body.urls)  # fmt: skip
        return _json(status)

    async def add_backend(request: web.Request) -> web.Response:
        return _json(await node.add_backend((await _body(request, BackendBody)).url))

    async def remove_backend(request: web.Request) -> web.Response:
        body = await _body(request, BackendBody)
        return _json(await node.remove_backend(body.url, body.timeout_s))

    async def cancel_stale(request: web.Request) -> web.Response:
        body = await _body(request, CancelStaleBody)
        return _json(CancelStaleAnswer(cancelled=await node.cancel_stale(body.older_than)))

    async def health(request: web.Request) -> web.Response:
        return json_response({"ok": True})  # open, so it tells nothing about sessions

    app.add_routes(
        [
            web.post("/sessions", guard(create)),
            web.post("/sessions/batch", guard(create_batch)),
            web.get("/sessions/{session_id}", guard(describe)),
            web.get("/sessions/{session_id}/result", guard(result)),
            web.delete("/sessions/{session_id}", guard(cancel)),
            web.get("/metrics", guard(metrics_handler([node.exposition]))),
            web.get("/metrics.json", guard(pipeline_metrics)),
            web.get("/inference", guard(inference)),
            web.post("/inference/pause", guard(pause)),
            web.post("/inference/resume", guard(resume)),
            web.post("/inference/load_weights", guard(load_weights)),
            web.post("/inference/backends", guard(add_backend)),
            web.delete("/inference/backends", guard(remove_backend)),
            web.post("/inference/cancel_stale", guard(cancel_stale)),
            web.get("/healthz", health),  # open
        ]
    )
    app[ERROR_SHAPE] = proxy_error_shape(PROXY_PREFIX)
    app.add_subapp(PROXY_PREFIX, create_proxy_app(node.proxy.config, node.proxy, mount=PROXY_PREFIX))
    return app
