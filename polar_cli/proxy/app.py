"""The aiohttp app: control routes (/sessions) and each session's proxy surface under ``/s/{session_id}``.

``create_proxy_app(config)`` makes a standalone app; ``setup_proxy(app, state)`` adds the same routes to a bigger
gateway app. A proxied call is: detect (path, then headers) → check the session key → decode → one backend call →
journal the Completion → answer (JSON or a synthetic SSE stream). Every failure is answered in the provider's shape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from aiohttp import web

from polar_cli.errors import BackendError, PolarError, ProtocolError
from polar_cli.http import json_errors
from polar_cli.ids import SESSION_ID_RULE, is_session_id
from polar_cli.proxy.capture import check_generation, completion_record
from polar_cli.proxy.codecs import Detected, detect, get_codec
from polar_cli.proxy.codecs.base import Codec
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.control import add_control_routes
from polar_cli.proxy.models_list import models_body
from polar_cli.proxy.retry import call_deadline
from polar_cli.proxy.sessions import Session
from polar_cli.proxy.state import ProxyState
from polar_cli.proxy.types import ChatRequest, Generation

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
            return await self._generate(session, codec, found, body, raw, started, request)
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
        self,
        session: Session,
        codec: Codec,
        found: Detected,
        body: dict[str, Any],
        raw: bytes,
        started: float,
        request: web.Request | None = None,
    ) -> web.StreamResponse:
        """Backend call (bounded by the session's deadline) → check the token data → encode the whole answer →
        journal the record → answer. A failure at any step before the journal write answers an error and records
        nothing; the journal line is flushed before the answer's first byte is sent."""
        chat = codec.decode(body, found.route)
        generation = await self._call_backend(session, chat)
        check_generation(generation)  # an invalid answer is a 502 and is never journaled
        if chat.stream:
            answer = web.Response(body=b"".join(codec.stream(generation, chat)), status=200, headers=_SSE_HEADERS)
        else:
            answer = _json(codec.encode(generation, chat))
        transport = request.transport if request is not None else None
        gone = request is not None and (transport is None or transport.is_closing())
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
            delivery="client_gone" if gone else "answered",
        )
        await self.state.registry.record(session, record)  # on disk before the harness sees the answer
        return answer

    async def _call_backend(self, session: Session, chat: ChatRequest) -> Generation:
        """One generation, never outliving the session's deadline (a provider-shaped 504 when it passes)."""
        left = session.time_left()
        if left is None:
            return await self.state.backend.generate(chat, session_id=session.session_id)
        if left <= 0:
            raise BackendError(f"session {session.session_id}: its deadline has passed", status=504)
        try:
            with call_deadline(session.deadline):
                async with asyncio.timeout(left) as scope:
                    return await self.state.backend.generate(chat, session_id=session.session_id)
        except TimeoutError as exc:
            if scope.expired():
                raise BackendError(
                    f"session {session.session_id}: no backend answer before its deadline", status=504
                ) from exc
            raise


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
