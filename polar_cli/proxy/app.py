"""The aiohttp app: control routes (/sessions) and each session's proxy surface under ``/s/{session_id}``.

``create_proxy_app(config)`` makes a standalone app; ``setup_proxy(app, state)`` adds the same routes to a bigger
gateway app. A proxied call is: detect (path, then headers) → check the session key → decode → one backend call →
journal the Completion → answer (JSON or a synthetic SSE stream). Every failure is answered in the provider's shape.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from aiohttp import web

from polar_cli.errors import BackendError, PolarError, ProtocolError
from polar_cli.http import json_errors
from polar_cli.ids import SESSION_ID_RULE, is_session_id
from polar_cli.proxy.capture import completion_record
from polar_cli.proxy.codecs import Detected, detect, get_codec
from polar_cli.proxy.codecs.base import Codec
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.control import add_control_routes
from polar_cli.proxy.models_list import models_body
from polar_cli.proxy.sessions import Session
from polar_cli.proxy.state import ProxyState

log = logging.getLogger("polar.proxy")

PROXY_STATE = web.AppKey("polar_proxy_state", ProxyState)
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def presented_keys(request: web.Request) -> list[str]:
    """Every API key the request carries: x-api-key, Authorization Bearer, x-goog-api-key, ?key=."""
    headers = request.headers
    keys = [k for k in (headers.get("x-api-key"), headers.get("x-goog-api-key")) if k]
    auth = headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        keys.append(auth[7:].strip())
    query_key = request.query.get("key")
    if query_key:
        keys.append(query_key)
    return keys


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def provider_error(codec: Codec | None, status: int, message: str) -> web.Response:
    if codec is None:
        return _json({"error": {"message": message}}, status)
    return _json(codec.error_body(status, message), status)


async def _read_body(request: web.Request) -> tuple[dict[str, Any], bytes]:
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    return body, raw


class ProxyHandler:
    """The per-session proxy surface."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.time()
        session_id = request.match_info["session_id"]
        tail = request.match_info.get("tail") or "/"
        headers = {k.lower(): v for k, v in request.headers.items()}
        found = detect(request.method, tail, headers, request.query)
        codec = get_codec(found.provider)
        if not is_session_id(session_id):
            return provider_error(codec, 400, f"invalid session id {session_id!r}: use {SESSION_ID_RULE}")
        if found.kind == "base":
            # harnesses probe their base URL, with or without a key: every well-formed id gets this same answer,
            # known or not, so a probe learns nothing about which sessions exist
            return web.Response(status=200) if request.method == "HEAD" else _json({"ok": True})
        session = self.state.registry.authenticate(session_id, presented_keys(request))
        if session is None:
            # unknown session or wrong key: same answer, nothing recorded
            return provider_error(codec, 401, "invalid API key for this session")
        try:
            if found.kind == "models":
                return _json(models_body(found.provider, await self.state.models()))
            if codec is None:
                return provider_error(None, 404, f"the {found.provider} protocol is not available in this proxy")
            if found.kind == "unknown":
                return provider_error(codec, 404, f"no such endpoint: {request.method} {found.route.path}")
            body, raw = await _read_body(request)
            if found.kind == "count_tokens":
                count = await self.state.backend.count_tokens(codec.decode_count_tokens(body, found.route))
                return _json(codec.count_tokens_body(count))
            return await self._generate(session, codec, found, body, raw, started)
        except ProtocolError as exc:
            return provider_error(codec, 400, str(exc))
        except BackendError as exc:
            log.warning("session %s: backend error: %s", session_id, exc)
            return provider_error(codec, exc.status, str(exc))
        except PolarError as exc:
            log.error("session %s: %s", session_id, exc)
            return provider_error(codec, 500, str(exc))
        except Exception as exc:  # the harness gets a provider-shaped 500, never a traceback
            log.exception("session %s: internal error", session_id)
            return provider_error(codec, 500, f"internal proxy error: {type(exc).__name__}: {exc}")

    async def _generate(
        self, session: Session, codec: Codec, found: Detected, body: dict[str, Any], raw: bytes, started: float
    ) -> web.StreamResponse:
        chat = codec.decode(body, found.route)
        generation = await self.state.backend.generate(chat, session_id=session.session_id)
        record = completion_record(
            session_id=session.session_id,
            index=session.count,
            provider=codec.provider,
            body=body,
            request=chat,
            generation=generation,
            started_at=started,
            finished_at=time.time(),
            path=found.route.path,
            raw_body=raw,
        )
        await self.state.registry.record(session, record)  # on disk before the harness sees the answer
        if not chat.stream:
            return _json(codec.encode(generation, chat))
        chunks: list[bytes] = []
        try:
            chunks.extend(codec.stream(generation, chat))
        except Exception as exc:  # a codec failure mid-stream: close the started stream with an error event
            log.exception("session %s: stream encoding failed", session.session_id)
            chunks.append(codec.stream_error(500, f"internal proxy error: {type(exc).__name__}: {exc}"))
        return web.Response(body=b"".join(chunks), status=200, headers=_SSE_HEADERS)


async def _root(request: web.Request) -> web.Response:
    return web.Response(status=200) if request.method == "HEAD" else _json({"ok": True, "service": "polar proxy"})


def setup_proxy(app: web.Application, state: ProxyState) -> None:
    """Add the control and proxy routes to ``app`` (standalone or the gateway's) and close the backend on cleanup."""
    app[PROXY_STATE] = state
    add_control_routes(app, state)
    handler = ProxyHandler(state)
    app.router.add_route("*", "/s/{session_id}{tail:.*}", handler.handle)

    async def _close(_app: web.Application) -> None:
        await state.close()

    app.on_cleanup.append(_close)


def create_proxy_app(config: ProxyConfig, state: ProxyState | None = None) -> web.Application:
    """The standalone proxy app (``polar proxy``)."""
    state = state or ProxyState(config)
    app = web.Application(
        client_max_size=int(config.max_body_mb * 1024 * 1024), middlewares=[json_errors(what="proxy")]
    )
    app.router.add_route("GET", "/", _root)
    app.router.add_route("HEAD", "/", _root)
    setup_proxy(app, state)
    return app
