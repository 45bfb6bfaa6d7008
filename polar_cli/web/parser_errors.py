"""Errors raised before any handler runs, answered in the app's error shape: ``app_runner(app)``.

aiohttp answers a request its HTTP parser rejects (bad request line, bad header, bad chunked framing, a
Content-Encoding it cannot decode) with text/plain from ``RequestHandler.handle_error``, before routing and
middlewares; it has no public hook for that (aio-libs/aiohttp#3287). ``app_runner`` serves the app with a
RequestHandler whose ``handle_error`` answers in the app's ERROR_SHAPE instead. This is the one module that uses
aiohttp's private API (``aiohttp.web_protocol``, ``web.Server`` internals); pin-bumps of aiohttp check it first.

The C parser does not say which request it rejected, and a chunk of bytes may hold the end of one request's body
and the head of the next (or several pipelined heads), so the handler follows the message framing itself
(``_Framing``: heads, Content-Length and chunked bodies) and knows the request line of every head in order: a
parser error belongs to the first head the parser has not handed over yet.

An error in the body of a request already handed to its handler (the C parser raises it at the end of a deflate
body that does not end its stream) would be queued as a second request while the handler still waits for that
body, which then never ends: no answer at all. It goes to that body instead (the handler's read fails and it
answers in its own shape), and the connection closes after that answer: nothing after a bad body can be parsed.

A parser error is the client's (a 4xx): it is logged as one INFO line, without aiohttp's traceback.

Its connections also set :func:`polar_cli.web.disconnect.client_gone` the moment the client hangs up.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.helpers import set_exception
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo

from polar_cli.web.disconnect import GONE
from polar_cli.web.errors import ERROR_SHAPE, ErrorShape, control_shape, error_response, log_refusal

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
        gone = request.get(GONE) if request is not None else None
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
        method, target = self._target(request, exc)
        if status >= 500:
            plain = super().handle_error(request, status, exc, message)  # logs; raises if a reply already started
            text = "internal server error" if status == 500 else f"HTTP {status} {plain.reason}"
        else:  # the client's error: one line, no traceback
            if request.writer.output_size > 0:
                raise ConnectionError("Response is sent already, cannot send another response with the error message")
            text = f"malformed HTTP request: {(message or HTTPStatus(status).phrase)[:200]}"
            log_refusal("server", method, target, status, text)
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
