"""JSON replies and errors: the control surfaces' one error shape ``{"error": {"message": ..., "type": ...}}``,
``status_for(exc)`` (the status declared on the error classes, ``http_status``) and ``json_errors``, a middleware that
answers every failure in that shape, aiohttp's own 404/405/413 included.

An app may set ``app[ERROR_SHAPE]`` to answer some paths in another shape: the proxy answers everything under
``/s/{session_id}`` in the detected provider's error shape (``polar_cli.proxy.app``). The middleware and
:func:`polar_cli.web.parser_errors.app_runner` both use it, so a reply has the same shape whether the handler, the
router or the HTTP parser refused the request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from polar_cli.errors import PolarError

log = logging.getLogger("polar.web")

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
    410: "gone",
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
    ``status_for``; anything else is logged with its traceback and answered 500. A client's error (4xx: a refused,
    cut or malformed body, a failed validation, a wrong token) is one INFO line, never a traceback.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = _http_message(exc, request)
            log_refusal(what, request.method, request.path, exc.status, message)
            return shaped_error(request, exc.status, message)
        except PolarError as exc:
            status = status_for(exc)
            message = str(exc)[:MAX_MESSAGE_CHARS]
            if status >= 500:
                log.error("%s: %s %s: %s", what, request.method, request.path[:200], message)
            else:
                log_refusal(what, request.method, request.path, status, message)
            return shaped_error(request, status, message)
        except Exception as exc:
            log.exception("%s: internal error on %s %s", what, request.method, request.path)
            return shaped_error(request, 500, f"internal {what} error: {type(exc).__name__}")

    return middleware


def log_refusal(what: str, method: str, target: str, status: int, message: str) -> None:
    """A client's error, as one INFO line (no traceback: nothing here failed)."""
    line = " ".join(message.split())[:MAX_MESSAGE_CHARS]
    log.info("%s: %s %s: client error %d: %s", what, method[:40], target[:200], status, line)


def _http_message(exc: web.HTTPException, request: web.Request) -> str:
    path = request.path[:200]
    if exc.status == 404:
        return f"no such route: {request.method[:40]} {path}"
    if exc.status == 405:
        return f"method {request.method[:40]} is not allowed on {path}"
    if exc.status == 413:
        return f"request body too large ({exc.text or exc.reason})"
    return exc.text or exc.reason
