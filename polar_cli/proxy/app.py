"""The aiohttp app: control routes (/sessions) and each session's proxy surface under ``/s/{session_id}``.

``create_proxy_app(config)`` makes a standalone app; ``setup_proxy(app, state)`` adds the same routes to a bigger
gateway app. A proxied call is: detect (path, then headers) → check the session key → decode → one backend call →
journal the Completion → answer (JSON or a synthetic SSE stream); from the decode on, one :class:`ProxyCall` carries
the call. Every failure is answered in the provider's shape, including aiohttp's own 404/405/413 and HTTP framing 400s
(``proxy_error_shape`` as the app's ``ERROR_SHAPE``: serve the app with ``polar_cli.web.listen.listen``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from yarl import URL

from polar_cli.errors import BackendError, PolarError, ProtocolError
from polar_cli.ids import SESSION_ID_RULE, is_session_id
from polar_cli.models.chat import ChatRequest, Generation, StreamMode
from polar_cli.proxy.capture import Delivery, check_generation, completion_record
from polar_cli.proxy.codecs import Detected, detect, get_codec
from polar_cli.proxy.codecs.base import Codec, StreamEncoder
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.control import add_control_routes
from polar_cli.proxy.models_list import models_body
from polar_cli.proxy.pool import PooledStream
from polar_cli.proxy.retry import call_deadline
from polar_cli.proxy.sampling import apply_sampling
from polar_cli.proxy.sessions import Session
from polar_cli.proxy.state import ProxyState
from polar_cli.proxy.streaming import SSE_HEADERS, pump, unless_client_leaves
from polar_cli.proxy.token_prompt import build_token_prompt
from polar_cli.web.auth import header_bytes
from polar_cli.web.body import OFFLOAD_BYTES, parse_json, read_raw
from polar_cli.web.disconnect import client_left
from polar_cli.web.errors import ERROR_SHAPE, MAX_MESSAGE_CHARS, ErrorShape, error_response, json_errors, status_for
from polar_cli.web.intake import intake

log = logging.getLogger("polar.proxy")

PROXY_STATE = web.AppKey("polar_proxy_state", ProxyState)
LIMIT_STATUS = 403
"""A call refused by the session's limits (``agent.limits``): a 4xx no SDK retries, in the provider's shape."""


def presented_keys(request: web.Request) -> list[bytes]:
    """Every API key the request carries (x-api-key, Authorization Bearer, x-goog-api-key, ?key=), as raw bytes:
    odd header bytes never break the comparison."""
    headers = request.headers
    keys = [k for k in (headers.get("x-api-key"), headers.get("x-goog-api-key")) if k]
    auth = headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        keys.append(auth[7:].strip())
    query_key = request.query.get("key")
    if query_key:
        keys.append(query_key)
    return [header_bytes(k) for k in keys]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def _parse_object(raw: bytes) -> dict[str, Any]:
    """A provider body as a JSON object (a big one parsed in a worker thread, as :mod:`polar_cli.web.body` does)."""
    body = (await asyncio.to_thread(parse_json, raw) if len(raw) >= OFFLOAD_BYTES else parse_json(raw)) if raw else None
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    return body


def provider_error(codec: Codec | None, status: int, message: str) -> web.Response:
    if codec is None:
        return error_response(status, message)
    return _json(codec.error_body(status, message), status)


def proxy_error_shape(prefix: str = "") -> ErrorShape:
    """The app's ``ERROR_SHAPE``: under ``{prefix}/s/{session_id}`` the detected provider's error body, elsewhere the
    control shape. ``prefix`` is where the proxy app is mounted (the gateway mounts it under ``/proxy``)."""
    root = f"{prefix}/s/"

    def shape(method: str, target: str, headers: Mapping[str, str], status: int, message: str) -> web.Response:
        url = URL(target, encoded=True)
        if not url.path.startswith(root):
            return error_response(status, message)
        tail = url.path[len(root) :].partition("/")[2]
        found = detect(method, "/" + tail, {k.lower(): v for k, v in headers.items()}, url.query)
        return provider_error(get_codec(found.provider), status, message)

    return shape


class ProxyHandler:
    """The per-session proxy surface."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self._fallback_logged = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One request under ``/s/{session_id}``, counted in the proxy's metrics by provider, endpoint, answer and
        stream mode (generation requests are timed too)."""
        began = time.monotonic()
        seen = _Seen()
        code = 500
        try:
            response = await self._handle(request, seen)
            code = response.status
            return response
        except asyncio.CancelledError:
            code = 499  # the client left before the answer
            raise
        finally:
            seconds = time.monotonic() - began if seen.endpoint == "generate" else None
            self.state.metrics.request(seen.provider, seen.endpoint, code, seen.stream, seconds)

    async def _handle(self, request: web.Request, seen: _Seen) -> web.StreamResponse:
        started = time.time()
        session_id = request.match_info["session_id"]
        tail = request.match_info.get("tail") or "/"
        headers = {k.lower(): v for k, v in request.headers.items()}
        found = detect(request.method, tail, headers, request.query)
        seen.provider, seen.endpoint = found.provider, found.kind
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
                where = f"{request.method[:40]} {found.route.path[:200]}"
                return provider_error(codec, 404, f"no such endpoint: {where}")
            if found.kind != "count_tokens":
                session.model_requests += 1
            raw = await read_raw(request)
            budget = await self.state.prompt_budget()
            big = len(raw) > budget.max_chars // 2  # only a big body pays for the budget's checks, off the loop
            if big:
                await asyncio.to_thread(budget.check_body, raw)
            body = await _parse_object(raw)
            counting = found.kind == "count_tokens"
            chat = codec.decode_count_tokens(body, found.route) if counting else codec.decode(body, found.route)
            if big:
                await asyncio.to_thread(budget.check_text, chat.messages, chat.tools, len(raw))
            chat.prompt_budget = budget.tokens
            if counting:
                return _json(codec.count_tokens_body(await self.state.backend.count_tokens(chat)))
            seen.stream = bool(chat.stream)
            if session.sampling is not None:
                apply_sampling(chat.params, session.sampling)  # the task's, over the harness's, for every provider
            guard = session.guard
            if guard is not None:
                hit = guard.admit()
                if hit is not None:  # refused before it goes upstream: nothing recorded
                    log.info("session %s: %s; call refused", session_id, hit.message)
                    return provider_error(codec, LIMIT_STATUS, f"Polar session {hit.message}: no more model calls")
                guard.clamp(chat.params)
            call = ProxyCall(self.state, request, session, codec, found, body, raw, started, chat)
            try:
                return await self._generate(call)
            finally:
                if guard is not None and not call.settled:
                    guard.settle(None)  # it failed: it counts for nothing
        except ProtocolError as exc:
            refused = provider_error(codec, status_for(exc), str(exc)[:MAX_MESSAGE_CHARS])
            if request.content.exception() is not None or not request.content.at_eof():
                refused.force_close()  # a body left unread or unreadable: the connection cannot carry another request
            return refused
        except BackendError as exc:
            log.warning("session %s: backend error: %s", session_id, exc)
            return provider_error(codec, exc.status, str(exc)[:MAX_MESSAGE_CHARS])
        except PolarError as exc:
            log.error("session %s: %s", session_id, exc)
            return provider_error(codec, 500, str(exc)[:MAX_MESSAGE_CHARS])
        except Exception as exc:  # the harness gets a provider-shaped 500, never a traceback
            log.exception("session %s: internal error", session_id)
            message = f"internal proxy error: {type(exc).__name__}: {str(exc)[:200]}"
            return provider_error(codec, 500, message)

    async def _generate(self, call: ProxyCall) -> web.StreamResponse:
        """A generation call, passed through as the backend streams it or answered whole (JSON, or a replayed
        stream)."""
        history = call.session.tokens
        if history is not None:  # token mode: the prompt as ids; its answer is replayed whole when streamed
            call.chat.token_prompt = await build_token_prompt(
                call.chat, history, self.state.backend, keep_reasoning=call.session.keep_reasoning
            )
            return await call.answer()
        encoder = call.codec.encoder(call.chat) if call.chat.stream else None
        if encoder is not None and self._passthrough(call.codec):
            return await call.stream(encoder)
        return await call.answer()

    def _passthrough(self, codec: Codec) -> bool:
        """Whether a streaming request is passed through (else replayed); the fallback is logged once per proxy."""
        if self.state.config.stream_mode != "passthrough":
            return False
        if self.state.backend.streams_token_ids:
            return True
        if not self._fallback_logged:
            self._fallback_logged = True
            log.info(
                "stream_mode passthrough: the %s backend does not stream token ids; streams are synthetic",
                self.state.backend.name or type(self.state.backend).__name__,
            )
        return False


@dataclass(slots=True)
class _Seen:
    """What a request turned out to be, for its metrics (bounded values only: never the session)."""

    provider: str = "unknown"
    endpoint: str = "unknown"
    stream: bool = False


@dataclass(slots=True)
class ProxyCall:
    """One generation call on its way through the proxy: the session it belongs to, the detected route and its
    codec, the body as sent (parsed and raw), when it arrived, and the normalized request it was decoded into."""

    state: ProxyState
    request: web.Request
    session: Session
    codec: Codec
    found: Detected
    body: dict[str, Any]
    raw: bytes
    started: float
    chat: ChatRequest
    settled: bool = False
    """Whether the session's limits counted it (it was recorded)."""

    async def answer(self) -> web.StreamResponse:
        """Backend call (bounded by the session's deadline) → check the token data → encode the whole answer →
        journal the record → answer. A failure at any step before the journal write answers an error and records
        nothing; the journal line is flushed before the answer's first byte is sent."""
        generation = await self.generate()
        check_generation(generation)  # an invalid answer is a 502 and is never journaled
        if self.chat.stream:
            body = b"".join(self.codec.stream(generation, self.chat))
            answer: web.Response = web.Response(body=body, status=200, headers=SSE_HEADERS)
        else:
            answer = _json(self.codec.encode(generation, self.chat))
        delivery: Delivery = "client_gone" if client_left(self.request) else "answered"
        await self.record(generation, delivery, "synthetic")
        return answer

    async def stream(self, encoder: StreamEncoder) -> web.StreamResponse:
        """Pass-through streaming (:mod:`polar_cli.proxy.streaming`): errors before the upstream answers are
        ordinary error responses; after that they are the provider's stream error event."""
        session, backend = self.session, self.state.backend
        left = session.time_left()
        if left is not None and left <= 0:
            raise BackendError(f"session {session.session_id}: its deadline has passed", status=504)
        try:
            with call_deadline(session.deadline):
                upstream = await unless_client_leaves(
                    self.request, backend.open_stream(self.chat, session_id=session.session_id)
                )
        except ConnectionResetError:  # gone during the prefill: nothing was sampled, nothing to answer or keep
            return web.Response(status=499)  # nginx's "client closed request", for the access log only

        async def record(generation: Generation, delivery: Delivery) -> None:
            if isinstance(upstream, PooledStream):
                upstream.stamp(generation)  # its version(s) and replica, counted as the stream was relayed
            await self.record(generation, delivery, "passthrough")

        return await pump(
            self.request,
            upstream,
            self.codec,
            encoder,
            self.chat,
            record,
            backend=backend.name,
            time_left=session.time_left(),
        )

    async def generate(self) -> Generation:
        """One generation, never outliving the session's deadline (a provider-shaped 504 when it passes)."""
        session, backend = self.session, self.state.backend
        left = session.time_left()
        if left is None:
            return await backend.generate(self.chat, session_id=session.session_id)
        if left <= 0:
            raise BackendError(f"session {session.session_id}: its deadline has passed", status=504)
        try:
            with call_deadline(session.deadline):
                async with asyncio.timeout(left) as scope:
                    return await backend.generate(self.chat, session_id=session.session_id)
        except TimeoutError as exc:
            if scope.expired():
                raise BackendError(
                    f"session {session.session_id}: no backend answer before its deadline", status=504
                ) from exc
            raise

    async def record(self, generation: Generation, delivery: Delivery, stream_mode: StreamMode) -> None:
        """Journal this call's Completion: on disk before the harness sees the answer (or the stream's end). Its
        ``request_params`` are what went upstream; ``metadata.sampling`` what the session's task forced. Logprobs of a
        reshaped distribution recorded raw are warned about once per task."""
        registry, session = self.state.registry, self.session
        record = completion_record(
            session_id=session.session_id,
            index=session.count,
            provider=self.codec.provider,
            body=self.body,
            request=self.chat,
            generation=generation,
            started_at=self.started,
            finished_at=time.time(),
            path=self.found.route.path,
            raw_body=self.raw,
            delivery=delivery,
            stream_mode=stream_mode,
        )
        if session.sampling is not None:
            record["metadata"]["sampling"] = session.sampling.forced()
        prompt = self.chat.token_prompt
        if prompt is not None:
            record["token_mode"] = "tokens"
            record["prompt_spans"] = [span.model_dump() for span in prompt.spans]
            record["metadata"]["token_prompt"] = prompt.record()
        written = await registry.record(session, record)
        if session.tokens is not None and prompt is not None:
            session.tokens.add(completion_id=record["completion_id"], request_messages=self.chat.messages,
                               response_message=generation.message, prompt_ids=prompt.ids,
                               response_ids=generation.response_ids, spans=prompt.spans,
                               finish_reason=generation.finish_reason)  # fmt: skip
        if session.guard is not None:  # once on disk: a limit it trips stops the harness, and what it kept is read
            session.guard.settle(generation.response_ids)
            self.settled = True
        self.state.metrics.captured(self.codec.provider, delivery, len(generation.prompt_ids),
                                    len(generation.response_ids), written)  # fmt: skip
        if generation.response_logprobs is not None:
            registry.raw_logprobs.check(session.task_key, self.chat.params, generation.logprobs_mode)


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


def create_proxy_app(config: ProxyConfig, state: ProxyState | None = None, *, mount: str = "") -> web.Application:
    """The standalone proxy app (``polar proxy``); ``mount``: the prefix it is added under as a sub-app, if any."""
    state = state or ProxyState(config)
    app = web.Application(
        client_max_size=int(config.max_body_mb * 1024 * 1024), middlewares=[intake, json_errors(what="proxy")]
    )
    app[ERROR_SHAPE] = proxy_error_shape(mount)
    app.router.add_route("GET", "/", _root)
    app.router.add_route("HEAD", "/", _root)
    setup_proxy(app, state)
    return app
