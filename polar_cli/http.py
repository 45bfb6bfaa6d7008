"""HTTP helpers shared by the proxy's control routes, the gateway node and the rollout server.

- one JSON error shape for control surfaces: ``{"error": {"message": ..., "type": ...}}``;
- ``status_for(exc)``: the HTTP status an exception maps to, declared on the error classes (``http_status``);
- the bearer-token guard (constant-time, safe on any header bytes) and control-token generation;
- ``json_errors``: a middleware that answers every failure in that shape, including aiohttp's own 404/405/413;
- ``app_runner``: an AppRunner whose errors raised before any handler runs (HTTP framing 400s from aiohttp's parser)
  are JSON too, not aiohttp's text/plain.

An app may set ``app[ERROR_SHAPE]`` to answer some paths in another shape: the proxy answers everything under
``/s/{session_id}`` in the detected provider's error shape (``polar_cli.proxy.app``). The middleware and the runner
both use it, so a reply has the same shape whether the handler, the router or the HTTP parser refused the request.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from polar_cli.errors import AuthError, ConfigError, PolarError

log = logging.getLogger("polar.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorShape = Callable[[str, str, Mapping[str, str], int, str], web.Response]
"""``(method, target, headers, status, message) -> response``: an error reply in the shape a path expects
(``target`` is the path with its query; ``headers`` may be empty when the request could not be parsed)."""

ERROR_SHAPE: web.AppKey[ErrorShape] = web.AppKey("polar_error_shape")
MAX_MESSAGE_CHARS = 500  # error messages echo at most this much of what a client sent

_ERROR_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
}


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON reply serialized with orjson."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request")


def error_response(status: int, message: str) -> web.Response:
    """The control surfaces' one error shape."""
    return json_response({"error": {"message": message, "type": error_type(status)}}, status)


def status_for(exc: BaseException) -> int:
    """The HTTP status an exception maps to: its ``http_status`` (declared on the PolarError classes), else 500."""
    status = getattr(exc, "http_status", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else 500


CONTROL_TOKEN_ENV = "POLAR_CONTROL_TOKEN"
"""Where ``polar proxy``, ``polar run`` and gateway nodes read their control token when no option gives one."""


def new_token() -> str:
    """A fresh control token (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def resolve_token(token: str | None, env_var: str | None = None) -> tuple[str, bool]:
    """The token to require: ``token``, else ``$env_var``, else a new one. Returns ``(token, generated)``."""
    if token:
        return token, False
    if env_var and os.environ.get(env_var):
        return os.environ[env_var], False
    return new_token(), True


def header_bytes(value: str) -> bytes:
    """A header (or query) value as the bytes to compare: aiohttp decodes header bytes with surrogateescape, so
    encoding back the same way never fails on odd bytes (surrogatepass covers lone surrogates from elsewhere)."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, if any."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() != "bearer ":
        return None
    return auth[7:].strip() or None


def bearer_matches(request: web.Request, token: str) -> bool:
    """Constant-time check of the request's bearer token against ``token``."""
    presented = bearer_token(request)
    return presented is not None and hmac.compare_digest(header_bytes(presented), header_bytes(token))


def check_bearer(request: web.Request, token: str, what: str) -> None:
    """AuthError (401) unless the request carries ``token``."""
    if not bearer_matches(request, token):
        raise AuthError(f"{what} needs its control token (Authorization: Bearer <token>)")


def guarded(token: str, what: str, handler: Handler) -> Handler:
    """``handler`` behind the bearer guard: without the token it is never called (401)."""

    async def wrapper(request: web.Request) -> web.StreamResponse:
        check_bearer(request, token, what)
        return await handler(request)

    return wrapper


async def read_json(request: web.Request, *, source: str, default: Any = None) -> Any:
    """The request body parsed as JSON; ConfigError (400) naming ``source`` when it is not. 413 past the app's
    ``client_max_size`` comes from aiohttp and is shaped by ``json_errors``."""
    raw = await request.read()
    if not raw.strip():
        if default is not None:
            return default
        raise ConfigError(f"{source}: the request body is empty (expected JSON)")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{source}: the body is not valid JSON: {exc}") from exc


def control_shape(method: str, target: str, headers: Mapping[str, str], status: int, message: str) -> web.Response:
    """The default :data:`ErrorShape`: the control error shape for every path."""
    return error_response(status, message)


def shaped_error(request: web.Request, status: int, message: str) -> web.Response:
    """An error reply in the shape the app wants for this request's path (``app[ERROR_SHAPE]``, else control)."""
    shape = request.app.get(ERROR_SHAPE, control_shape)
    return shape(request.method, request.path_qs, request.headers, status, message)


def json_errors(*, what: str = "server") -> Any:
    """Middleware: every failure becomes a JSON error (the control shape, or the app's ``ERROR_SHAPE``), never
    text/plain and never a traceback.

    aiohttp's HTTP exceptions (404 no route, 405, 413 body too large) keep their status; PolarErrors map through
    ``status_for``; anything else is logged and answered 500.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await _answer(request, handler)
        # a body that could not be decoded, or an encoded one left unread (decoding it later may fail, and aiohttp
        # would then answer a second time on this connection): nothing after it on this connection is safe to parse
        unread = request.headers.get("Content-Encoding") and not request.content.at_eof()
        if (request.content.exception() is not None or unread) and not response.prepared:
            response.force_close()
        return response

    async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return shaped_error(request, exc.status, _http_message(exc, request))
        except PolarError as exc:
            status = status_for(exc)
            if status >= 500:
                log.error("%s: %s %s: %s", what, request.method, request.path, exc)
            return shaped_error(request, status, str(exc)[:MAX_MESSAGE_CHARS])
        except Exception as exc:
            log.exception("%s: internal error on %s %s", what, request.method, request.path)
            return shaped_error(request, 500, f"internal {what} error: {type(exc).__name__}")

    return middleware


def _http_message(exc: web.HTTPException, request: web.Request) -> str:
    path = request.path[:200]
    if exc.status == 404:
        return f"no such route: {request.method[:40]} {path}"
    if exc.status == 405:
        return f"method {request.method[:40]} is not allowed on {path}"
    if exc.status == 413:
        return f"request body too large ({exc.text or exc.reason})"
    return exc.text or exc.reason


# ---- errors raised before any handler runs ---------------------------------------------------------------------
#
# aiohttp answers a request its HTTP parser rejects (bad request line, bad header, bad chunked framing) with
# text/plain from ``RequestHandler.handle_error``, before routing and middlewares; it has no public hook for that
# (aio-libs/aiohttp#3287). ``app_runner`` serves the app with a RequestHandler whose ``handle_error`` answers in the
# app's ERROR_SHAPE instead. The parser does not say which path a rejected request named, so the handler keeps the
# newest request line it saw in the data received (a chunk may also hold the end of the previous request).

_REQUEST_LINE = re.compile(rb"([A-Z]{1,20}) (/\S{0,8190}) HTTP/\S{1,10}\r?")


class ShapedErrorsRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering parser and last-resort errors as JSON in the app's shape."""

    shape: ErrorShape = staticmethod(control_shape)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_line: tuple[str, str] = ("UNKNOWN", "/")
        self._error_targets: dict[int, tuple[str, str]] = {}

    def data_received(self, data: bytes) -> None:
        # the newest request line in the chunk: a chunk may start with the previous request's body
        at = data.rfind(b" HTTP/1.")
        if at > 0:
            start = data.rfind(b"\n", max(0, at - 8250), at) + 1  # a request line is at most max_line_size (8190) long
            end = data.find(b"\n", at)
            line = _REQUEST_LINE.fullmatch(data, start, end if end >= 0 else len(data))
            if line is not None:
                self._request_line = (line.group(1).decode("latin-1"), line.group(2).decode("latin-1"))
        queued = len(self._messages)
        super().data_received(data)
        # a parser error is queued and answered later, maybe after more requests arrived: pin its request line now
        for message, _payload in list(self._messages)[queued:]:
            exc = getattr(message, "exc", None)
            if isinstance(exc, BaseException):
                if len(self._error_targets) > 64:
                    self._error_targets.clear()
                self._error_targets[id(exc)] = self._request_line

    def _target(self, request: web.BaseRequest, exc: BaseException | None) -> tuple[str, str]:
        if request.path != "/" or request.method != "UNKNOWN":  # a parsed request: its own method and path
            return request.method, request.path_qs
        pinned = self._error_targets.pop(id(exc), None) if exc is not None else None
        return pinned or self._request_line

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)  # logs; raises if a reply already started
        if status >= 500:
            text = "internal server error" if status == 500 else f"HTTP {status} {plain.reason}"
        else:
            text = f"malformed HTTP request: {(message or plain.reason)[:200]}"
        method, target = self._target(request, exc)
        try:
            headers = request.headers if request.method != "UNKNOWN" else {}
            reply = self.shape(method, target, headers, status, text)
        except Exception:  # a shape that cannot read this garbage: the control shape still answers JSON
            reply = error_response(status, text)
        reply.force_close()
        return reply


class _ShapedServer(web.Server):
    def __init__(self, base: web.Server, shape: ErrorShape) -> None:
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
        handler_class = type("PolarRequestHandler", (ShapedErrorsRequestHandler,), {"shape": staticmethod(shape)})
        self._handler_class: type[ShapedErrorsRequestHandler] = handler_class

    def __call__(self) -> RequestHandler:
        return self._handler_class(self, loop=self._loop, **self._kwargs)


class _ShapedAppRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return _ShapedServer(base, self.app.get(ERROR_SHAPE, control_shape))


def app_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """``web.AppRunner(app, **kwargs)`` whose HTTP-parser errors are JSON in ``app[ERROR_SHAPE]`` (else control)."""
    return _ShapedAppRunner(app, **kwargs)
