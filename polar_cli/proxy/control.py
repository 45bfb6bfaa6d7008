"""Control routes: create, inspect, list completions of, and delete sessions.

Every control route needs the proxy's control token (``Authorization: Bearer``, compared in constant time): sessions
hold secrets and every recorded prompt. ``/healthz`` is open and says only that the proxy is up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import Field

from polar_cli.errors import ConfigError
from polar_cli.ids import SessionId, check_session_id
from polar_cli.models import SamplingSpec, SessionLimits, StrictModel, TokenMode, validate_model
from polar_cli.proxy.backends.scripted import InlineScript
from polar_cli.web.auth import guarded
from polar_cli.web.body import read_json
from polar_cli.web.errors import json_response

if TYPE_CHECKING:
    from polar_cli.proxy.state import ProxyState


class ProxySessionCreate(StrictModel):
    """Body of ``POST /sessions``. ``script`` and ``backend_options`` are checked against the backend's per-session
    allow-list: a script is inline (a list of turns, or a mapping of variants), never a path. ``sampling`` is forced
    onto every model call; ``limits`` are enforced on them."""

    session_id: SessionId | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    script: InlineScript | None = Field(default=None, description="scripted backend: this session's own turns")
    backend_options: dict[str, Any] = Field(default_factory=dict)
    sampling: SamplingSpec | None = None
    limits: SessionLimits | None = None
    token_mode: TokenMode | None = Field(default=None, description="messages or tokens; default: the proxy's")
    keep_reasoning: bool = True


def _origin(request: web.Request, state: ProxyState) -> str:
    return state.base_url or f"{request.scheme}://{request.host}"


def _session_id(request: web.Request) -> str:
    return check_session_id(request.match_info["session_id"])


def add_control_routes(app: web.Application, state: ProxyState) -> None:
    token = state.config.control_token

    async def create(request: web.Request) -> web.Response:
        data = await read_json(request, source="POST /sessions", default={})
        spec = validate_model(ProxySessionCreate, data, source="POST /sessions")
        options = dict(spec.backend_options)
        if spec.script is not None:
            if "script" in options:
                raise ConfigError("POST /sessions: give the script once: script or backend_options.script")
            options["script"] = spec.script
        session = await state.registry.create_session(
            spec.session_id, spec.metadata, options, sampling=spec.sampling, limits=spec.limits,
            token_mode=spec.token_mode, keep_reasoning=spec.keep_reasoning,
        )  # fmt: skip
        return json_response(state.session_info(session, _origin(request, state)), 201)

    async def list_sessions(request: web.Request) -> web.Response:
        origin = _origin(request, state)
        return json_response({"sessions": [s.summary(origin) for s in state.registry.sessions()]})

    async def get_session(request: web.Request) -> web.Response:
        session = state.registry.get(_session_id(request))
        return json_response(session.summary(_origin(request, state)))

    async def completions(request: web.Request) -> web.Response:
        body = state.registry.completions_json(_session_id(request))
        return web.Response(body=body, content_type="application/json")

    async def delete(request: web.Request) -> web.Response:
        session = await state.registry.close_session(_session_id(request))
        return json_response({**session.summary(None), "deleted": True})

    async def health(request: web.Request) -> web.Response:
        return json_response({"ok": True})  # open, so it tells nothing about sessions or the backend

    def guard(handler: Any) -> Any:
        return guarded(token, "this proxy's control routes", handler)

    app.router.add_post("/sessions", guard(create))
    app.router.add_get("/sessions", guard(list_sessions))
    app.router.add_get("/sessions/{session_id}", guard(get_session))
    app.router.add_get("/sessions/{session_id}/completions", guard(completions))
    app.router.add_delete("/sessions/{session_id}", guard(delete))
    app.router.add_get("/healthz", health)
