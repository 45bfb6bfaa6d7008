"""HTTP helpers shared by the proxy's control routes, the gateway node and the rollout server.

- one JSON error shape for control surfaces: ``{"error": {"message": ..., "type": ...}}``;
- ``status_for(exc)``: the HTTP status an exception maps to, declared on the error classes (``http_status``);
- the bearer-token guard (constant-time, safe on any header bytes) and control-token generation;
- ``json_errors``: a middleware that answers every failure in that shape, including aiohttp's own 404/405/413;
- ``app_runner``: an AppRunner whose errors raised before any handler runs (HTTP framing 400s from aiohttp's parser)
  are JSON too, not aiohttp's text/plain; and ``client_gone(request)``, an event its connections set the moment the
  client hangs up (a streaming handler stops its upstream then, not at its next write).

An app may set ``app[ERROR_SHAPE]`` to answer some paths in another shape: the proxy answers everything under
``/s/{session_id}`` in the detected provider's error shape (``polar_cli.proxy.app``). The middleware and the runner
both use it, so a reply has the same shape whether the handler, the router or the HTTP parser refused the request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.helpers import set_exception
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo

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

_GONE: web.RequestKey[asyncio.Event] = web.RequestKey("polar_client_gone", asyncio.Event)


def client_left(request: web.BaseRequest) -> bool:
    """Whether ``request``'s client has hung up by now (its transport is gone or closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def client_gone(request: web.BaseRequest) -> asyncio.Event:
    """Set once ``request``'s client has hung up: at once when it already has, else when its connection is lost
    (on a server started with :func:`app_runner`; elsewhere only a request whose client left before this call)."""
    gone = request.get(_GONE)
    if gone is None:
        gone = request[_GONE] = asyncio.Event()
        if client_left(request):
            gone.set()
    return gone


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
# aiohttp answers a request its HTTP parser rejects (bad request line, bad header, bad chunked framing, a
# Content-Encoding it cannot decode) with text/plain from ``RequestHandler.handle_error``, before routing and
# middlewares; it has no public hook for that (aio-libs/aiohttp#3287). ``app_runner`` serves the app with a
# RequestHandler whose ``handle_error`` answers in the app's ERROR_SHAPE instead.
#
# The C parser does not say which request it rejected, and a chunk of bytes may hold the end of one request's body
# and the head of the next (or several pipelined heads), so the handler follows the message framing itself
# (``_Framing``: heads, Content-Length and chunked bodies) and knows the request line of every head in order: a
# parser error belongs to the first head the parser has not handed over yet.
#
# An error in the body of a request already handed to its handler (the C parser raises it at the end of a deflate
# body that does not end its stream) would be queued as a second request while the handler still waits for that
# body, which then never ends: no answer at all. It goes to that body instead (the handler's read fails and it
# answers in its own shape), and the connection closes after that answer: nothing after a bad body can be parsed.

_MAX_HEAD_LINE = 16 * 1024  # longer than aiohttp's limits (8190): the parser rejects such a head anyway


class _Framing:
    """The request line of each request on a connection, found by following HTTP/1.1 framing over its raw bytes."""

    def __init__(self) -> None:
        self.lines: dict[int, bytes] = {}  # head index (0 = the connection's first request) -> its request line
        self.count = 0  # heads whose request line is complete
        self._state = "line"  # line | headers | body | size | data | trailers | lost
        self._buf = bytearray()  # the current, unfinished line
        self._left = 0  # bytes left in a Content-Length body or a chunk (with its CRLF)
        self._length: int | None = None
        self._chunked = False
        self._upgrade = False

    def line(self, index: int) -> bytes | None:
        """The request line of head ``index``; the start of it while it is still arriving."""
        if index == self.count and self._state == "line":
            return bytes(self._buf).lstrip(b"\r\n") or None
        return self.lines.get(index)

    def forget_before(self, index: int) -> None:
        for old in [i for i in self.lines if i < index]:
            del self.lines[old]

    def feed(self, data: bytes) -> None:
        at, size = 0, len(data)
        while at < size and self._state != "lost":
            if self._state in ("body", "data"):
                step = min(self._left, size - at)
                self._left -= step
                at += step
                if self._left == 0:
                    self._state = "size" if self._state == "data" else "line"
                continue
            end = data.find(b"\n", at)
            piece = data[at : end + 1 if end >= 0 else size]
            at += len(piece)
            if len(self._buf) + len(piece) > _MAX_HEAD_LINE:
                self._buf += piece[: _MAX_HEAD_LINE - len(self._buf)]
                if self._state == "line":
                    self._line_done()
                self._state = "lost"  # the parser refuses this head; nothing after it is parsed
                break
            self._buf += piece
            if end >= 0:
                line = bytes(self._buf).rstrip(b"\r\n")
                self._buf.clear()
                self._on_line(line)

    def _line_done(self) -> None:
        self.lines[self.count] = bytes(self._buf).rstrip(b"\r\n")
        self.count += 1

    def _on_line(self, line: bytes) -> None:
        if self._state == "line":
            if not line:
                return  # empty lines before a request line are skipped
            self._buf += line
            self._line_done()
            self._buf.clear()
            self._length, self._chunked = None, False
            self._upgrade = line.split(b" ", 1)[0] == b"CONNECT"
            self._state = "headers"
        elif self._state == "headers":
            if line:
                name, _, value = line.partition(b":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == b"content-length":
                    self._length = int(value) if value.isdigit() else None
                elif name == b"transfer-encoding":
                    self._chunked = value.rsplit(b",", 1)[-1].strip() == b"chunked"
                elif name == b"upgrade":
                    self._upgrade = True
            elif self._upgrade:
                self._state = "lost"  # another protocol follows (or may): no more HTTP/1 framing to follow
            elif self._chunked:
                self._state = "size"
            elif self._length:
                self._state, self._left = "body", self._length
            else:
                self._state = "line"
        elif self._state == "size":
            digits = line.split(b";", 1)[0].strip()
            try:
                chunk = int(digits, 16)
            except ValueError:
                self._state = "lost"
                return
            self._state, self._left = ("trailers", 0) if chunk == 0 else ("data", chunk + 2)
        elif self._state == "trailers" and not line:
            self._state = "line"


def _split_request_line(line: bytes | None) -> tuple[str, str]:
    """``(method, target)`` of a (maybe partial or garbled) request line; ``("UNKNOWN", "/")`` when it has none."""
    parts = (line or b"").split(b" ")
    method = parts[0][:20].decode("latin-1") if parts[0] else "UNKNOWN"
    target = parts[1][:8192].decode("latin-1") if len(parts) > 1 else "/"
    return method, target


class ShapedErrorsRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering parser and last-resort errors as JSON in the app's shape."""

    shape: ErrorShape = staticmethod(control_shape)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._framing = _Framing()
        self._handed = 0  # requests the parser has handed over (the index of the next head)
        self._last_payload: Any = None  # the body of the newest request handed over
        self._error_targets: dict[int, tuple[str, str]] = {}

    def connection_lost(self, exc: BaseException | None) -> None:
        request = self._current_request
        super().connection_lost(exc)
        gone = request.get(_GONE) if request is not None else None
        if gone is not None:
            gone.set()

    def data_received(self, data: bytes) -> None:
        self._framing.feed(data)
        idle = self._waiter is not None and not self._waiter.done()  # no request in progress
        queued = len(self._messages)
        super().data_received(data)
        for message, payload in list(self._messages)[queued:]:
            exc = getattr(message, "exc", None)
            if not isinstance(message, _ErrInfo) or not isinstance(exc, BaseException):
                self._handed += 1
                self._last_payload = payload
                continue
            body = self._last_payload
            if not idle and isinstance(body, StreamReader) and not body.is_eof() and body.exception() is None:
                # the error is in the body of a request its handler already has: that body fails, and the handler
                # answers (or the lingering read after its answer closes the connection)
                at = next(i for i, queued_message in enumerate(self._messages) if queued_message[0] is message)
                del self._messages[at]
                set_exception(body, RequestPayloadError(str(exc)), exc)
                continue
            if len(self._error_targets) > 64:
                self._error_targets.clear()
            self._error_targets[id(exc)] = _split_request_line(self._framing.line(self._handed))
        self._framing.forget_before(self._handed)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        # the parser stops at a bad body (it parses nothing after it): the answer to that request closes the
        # connection, so the client's next request starts on a new one
        body = request.content
        if isinstance(body, StreamReader) and body.exception() is not None and not resp.prepared:
            resp.force_close()
        return await super().finish_response(request, resp, start_time)

    def _target(self, request: web.BaseRequest, exc: BaseException | None) -> tuple[str, str]:
        if request.path != "/" or request.method != "UNKNOWN":  # a parsed request: its own method and path
            return request.method, request.path_qs
        pinned = self._error_targets.pop(id(exc), None) if exc is not None else None
        return pinned or _split_request_line(self._framing.line(self._handed))

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
