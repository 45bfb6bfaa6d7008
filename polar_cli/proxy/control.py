"""Control routes: create, inspect, list completions of, and delete sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import Field

from polar_cli.http import guarded, json_response, read_json
from polar_cli.models import StrictModel, validate_model

if TYPE_CHECKING:
    from polar_cli.proxy.state import ProxyState


class SessionCreate(StrictModel):
    """Body of ``POST /sessions``."""

    session_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    script: list[Any] | None = Field(default=None, description="scripted backend: this session's own script")
    backend_options: dict[str, Any] = Field(default_factory=dict)


def _origin(request: web.Request, state: ProxyState) -> str:
    return state.base_url or f"{request.scheme}://{request.host}"


def add_control_routes(app: web.Application, state: ProxyState) -> None:
    token = state.config.control_token

    async def create(request: web.Request) -> web.Response:
        data = await read_json(request, source="POST /sessions", default={})
        spec = validate_model(SessionCreate, data, source="POST /sessions")
        options = dict(spec.backend_options)
        if spec.script is not None:
            options["script"] = spec.script
        session = await state.registry.create_session(spec.session_id, spec.metadata, options)
        return json_response(state.session_info(session, _origin(request, state)), 201)

    async def list_sessions(request: web.Request) -> web.Response:
        origin = _origin(request, state)
        return json_response({"sessions": [s.summary(origin) for s in state.registry.sessions()]})

    async def get_session(request: web.Request) -> web.Response:
        session = state.registry.get(request.match_info["session_id"])
        return json_response(session.summary(_origin(request, state)))

    async def completions(request: web.Request) -> web.Response:
        body = state.registry.completions_json(request.match_info["session_id"])
        return web.Response(body=body, content_type="application/json")

    async def delete(request: web.Request) -> web.Response:
        session = await state.registry.close_session(request.match_info["session_id"])
        return json_response({**session.summary(None), "deleted": True})

    async def health(request: web.Request) -> web.Response:
        return json_response({"ok": True, "backend": state.config.backend, "sessions": len(state.registry.sessions())})

    def guard(handler: Any) -> Any:
        if not token:
            return handler
        return guarded(token, "this proxy's control routes", handler)

    app.router.add_post("/sessions", guard(create))
    app.router.add_get("/sessions", guard(list_sessions))
    app.router.add_get("/sessions/{session_id}", guard(get_session))
    app.router.add_get("/sessions/{session_id}/completions", guard(completions))
    app.router.add_delete("/sessions/{session_id}", guard(delete))
    app.router.add_get("/healthz", health)
