"""The rollout server's HTTP routes (docs/service.md): parse and check each call, then one RolloutServer method."""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from polar_cli.errors import ConfigError
from polar_cli.models import TaskRequest, validate_model
from polar_cli.models.limits import (
    MAX_CONTROL_BODY_BYTES,
    MAX_NODE_BODY_BYTES,
    MAX_RESULT_BODY_BYTES,
    MAX_TASK_BODY_BYTES,
    MAX_WAIT_S,
)
from polar_cli.node_protocol import (
    BackendBody,
    CancelStaleBody,
    HeartbeatBody,
    LoadWeightsBody,
    PauseBody,
    RegisterBody,
    ResumeBody,
    SessionResultBody,
)
from polar_cli.server.service import RolloutServer
from polar_cli.web.auth import guarded
from polar_cli.web.body import read_json
from polar_cli.web.errors import Handler, json_errors, json_response
from polar_cli.web.intake import intake
from polar_cli.web.metrics import metrics_handler

M = TypeVar("M", bound=BaseModel)


def _json(model: BaseModel, status: int = 200) -> web.Response:
    return json_response(model.model_dump(mode="json"), status)


async def _body(request: web.Request, model: type[M], limit: int, *, default: object = None) -> M:
    """The request's JSON body (at most ``limit`` bytes, else a 413) as ``model`` (a 400 naming the field when it is
    not one)."""
    source = f"{request.method} {request.path}"
    data = await read_json(request, source=source, default=default, limit=limit)
    return validate_model(model, data, source=source)


def create_app(server: RolloutServer) -> web.Application:
    """Every route but ``GET /healthz`` needs a token: the server's, or (heartbeats, results) the calling node's,
    checked before the body is read. Each route reads at most its own limit (``polar_cli.models.limits``)."""
    middlewares = [intake, json_errors(what="rollout server")]
    app = web.Application(client_max_size=MAX_RESULT_BODY_BYTES, middlewares=middlewares)

    def guard(handler: Handler) -> Handler:
        return guarded(server.token, "the rollout server", handler, token_name="server token")

    async def submit(request: web.Request) -> web.Response:
        return _json(await server.submit(await _body(request, TaskRequest, MAX_TASK_BODY_BYTES)))

    async def task_status(request: web.Request) -> web.Response:
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError as exc:
            raise ConfigError("wait must be a number of seconds") from exc
        if not wait <= MAX_WAIT_S:  # nan fails this too
            raise ConfigError(f"wait must be a number of seconds, at most {MAX_WAIT_S:g}")
        return _json(await server.status(request.match_info["task_id"], wait))

    async def task_request(request: web.Request) -> web.Response:
        return _json(await server.task_request(request.match_info["task_id"]))

    async def ended_tasks(request: web.Request) -> web.Response:
        try:
            since = float(request.query.get("since", "0"))
        except ValueError as exc:
            raise ConfigError("since must be a time in seconds since the epoch") from exc
        return _json(await server.ended_tasks(since))

    async def ack(request: web.Request) -> web.Response:
        return _json(await server.ack(request.match_info["task_id"]))

    async def cancel(request: web.Request) -> web.Response:
        return _json(await server.cancel(request.match_info["task_id"]))

    async def status(request: web.Request) -> web.Response:
        return _json(await server.service_status())

    async def register(request: web.Request) -> web.Response:
        return _json(await server.register(await _body(request, RegisterBody, MAX_NODE_BODY_BYTES)))

    async def heartbeat(request: web.Request) -> web.Response:
        node_id = request.match_info["node_id"]
        server.check_node(node_id, request)  # before the body is even read: a wrong token changes nothing
        body = await _body(request, HeartbeatBody, MAX_NODE_BODY_BYTES, default={})
        return _json(await server.heartbeat(node_id, body))

    async def session_result(request: web.Request) -> web.Response:
        source = "POST /callbacks/session_result"
        server.check_some_node(request)  # before the body is read: without a node's token it costs nothing
        data = await read_json(request, source=source, limit=MAX_RESULT_BODY_BYTES)
        node_id = data.get("node_id") if isinstance(data, dict) else None
        server.check_node(str(node_id), request)
        body = validate_model(SessionResultBody, data, source=source)
        return _json(await server.session_result(body))

    async def drain(request: web.Request) -> web.Response:
        return json_response(await server.drain(request.match_info["node_id"]))

    inference = server.inference

    async def pool_status(request: web.Request) -> web.Response:
        return _json(await inference.status())

    async def pause(request: web.Request) -> web.Response:
        return _json(await inference.pause(await _body(request, PauseBody, MAX_CONTROL_BODY_BYTES, default={})))

    async def resume(request: web.Request) -> web.Response:
        return _json(await inference.resume(await _body(request, ResumeBody, MAX_CONTROL_BODY_BYTES, default={})))

    async def load_weights(request: web.Request) -> web.Response:
        return _json(await inference.load_weights(await _body(request, LoadWeightsBody, MAX_CONTROL_BODY_BYTES)))

    async def add_backend(request: web.Request) -> web.Response:
        return _json(await inference.add_backend(await _body(request, BackendBody, MAX_CONTROL_BODY_BYTES)))

    async def remove_backend(request: web.Request) -> web.Response:
        return _json(await inference.remove_backend(await _body(request, BackendBody, MAX_CONTROL_BODY_BYTES)))

    async def cancel_stale(request: web.Request) -> web.Response:
        body = await _body(request, CancelStaleBody, MAX_CONTROL_BODY_BYTES, default={})
        return _json(await inference.cancel_stale(body))

    async def health(request: web.Request) -> web.Response:
        return json_response({"ok": True})

    app.router.add_post("/rollout/task/submit", guard(submit))
    app.router.add_get("/rollout/task/{task_id}", guard(task_status))
    app.router.add_get("/rollout/task/{task_id}/request", guard(task_request))
    app.router.add_delete("/rollout/task/{task_id}", guard(cancel))
    app.router.add_post("/rollout/task/{task_id}/ack", guard(ack))
    app.router.add_get("/rollout/tasks", guard(ended_tasks))
    app.router.add_get("/rollout/status", guard(status))
    app.router.add_get("/metrics", guard(metrics_handler([server.exposition])))
    app.router.add_post("/nodes/register", guard(register))
    app.router.add_post("/nodes/{node_id}/heartbeat", heartbeat)
    app.router.add_delete("/nodes/{node_id}", guard(drain))
    app.router.add_post("/callbacks/session_result", session_result)
    app.router.add_get("/inference", guard(pool_status))
    app.router.add_post("/inference/pause", guard(pause))
    app.router.add_post("/inference/resume", guard(resume))
    app.router.add_post("/inference/load_weights", guard(load_weights))
    app.router.add_post("/inference/backends", guard(add_backend))
    app.router.add_delete("/inference/backends", guard(remove_backend))
    app.router.add_post("/inference/cancel_stale", guard(cancel_stale))
    app.router.add_get("/healthz", health)

    async def on_shutdown(_: web.Application) -> None:
        server.stop_waiting()

    app.on_shutdown.append(on_shutdown)
    return app
