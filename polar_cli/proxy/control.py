"""Control routes: create, inspect, list completions of, and delete sessions."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from pydantic import Field

from polar_cli.errors import ConfigError, PolarError, SessionError
from polar_cli.models import StrictModel, validate_model

if TYPE_CHECKING:
    from polar_cli.proxy.state import ProxyState


class SessionCreate(StrictModel):
    """Body of ``POST /sessions``."""

    session_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    script: list[Any] | None = Field(default=None, description="scripted backend: this session's own script")
    backend_options: dict[str, Any] = Field(default_factory=dict)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": {"message": message}}, status)


def _origin(request: web.Request, state: ProxyState) -> str:
    return state.base_url or f"{request.scheme}://{request.host}"


def add_control_routes(app: web.Application, state: ProxyState) -> None:
    token = state.config.control_token

    def authorized(request: web.Request) -> bool:
        if not token:
            return True
        auth = request.headers.get("Authorization", "")
        return hmac.compare_digest(auth.encode(), f"Bearer {token}".encode())

    async def create(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            data = orjson.loads(raw) if raw.strip() else {}
            spec = validate_model(SessionCreate, data, source="POST /sessions")
            options = dict(spec.backend_options)
            if spec.script is not None:
                options["script"] = spec.script
            session = await state.registry.create_session(spec.session_id, spec.metadata, options)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"body is not valid JSON: {exc}")
        except SessionError as exc:
            return _error(409, str(exc))
        except ConfigError as exc:
            return _error(400, str(exc))
        return _json(state.session_info(session, _origin(request, state)), 201)

    async def list_sessions(request: web.Request) -> web.Response:
        origin = _origin(request, state)
        return _json({"sessions": [s.summary(origin) for s in state.registry.sessions()]})

    async def get_session(request: web.Request) -> web.Response:
        session = state.registry.get(request.match_info["session_id"])
        return _json(session.summary(_origin(request, state)))

    async def completions(request: web.Request) -> web.Response:
        body = state.registry.completions_json(request.match_info["session_id"])
        return web.Response(body=body, content_type="application/json")

    async def delete(request: web.Request) -> web.Response:
        session = await state.registry.close_session(request.match_info["session_id"])
        return _json({**session.summary(None), "deleted": True})

    async def health(request: web.Request) -> web.Response:
        return _json({"ok": True, "backend": state.config.backend, "sessions": len(state.registry.sessions())})

    def guarded(fn: Any) -> Any:
        async def wrapper(request: web.Request) -> web.Response:
            if not authorized(request):
                return _error(401, "this proxy's control routes need its control token (Authorization: Bearer)")
            try:
                return await fn(request)
            except SessionError as exc:
                return _error(404, str(exc))
            except PolarError as exc:
                return _error(500, str(exc))

        return wrapper

    app.router.add_post("/sessions", guarded(create))
    app.router.add_get("/sessions", guarded(list_sessions))
    app.router.add_get("/sessions/{session_id}", guarded(get_session))
    app.router.add_get("/sessions/{session_id}/completions", guarded(completions))
    app.router.add_delete("/sessions/{session_id}", guarded(delete))
    app.router.add_get("/healthz", health)
