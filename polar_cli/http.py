"""HTTP helpers shared by the proxy's control routes, the gateway node and the rollout server.

- one JSON error shape for control surfaces: ``{"error": {"message": ..., "type": ...}}``;
- ``status_for(exc)``: the HTTP status an exception maps to, declared on the error classes (``http_status``);
- the bearer-token guard (constant-time, safe on any header bytes) and control-token generation;
- ``json_errors``: a middleware that answers every failure in that shape, including aiohttp's own 404/405/413.

The proxy's provider routes answer in each provider's own error shape instead (``polar_cli.proxy.app``); they reuse
``status_for`` and ``bearer_matches``.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from polar_cli.errors import AuthError, ConfigError, PolarError

log = logging.getLogger("polar.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

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


def _raw(value: str) -> bytes:
    # aiohttp decodes header bytes with surrogateescape: encoding back the same way can never fail on odd bytes
    return value.encode("utf-8", "surrogateescape")


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, if any."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() != "bearer ":
        return None
    return auth[7:].strip() or None


def bearer_matches(request: web.Request, token: str) -> bool:
    """Constant-time check of the request's bearer token against ``token``."""
    presented = bearer_token(request)
    return presented is not None and hmac.compare_digest(_raw(presented), _raw(token))


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


def json_errors(*, what: str = "server") -> Any:
    """Middleware: every failure becomes the control error shape, never text/plain and never a traceback.

    aiohttp's HTTP exceptions (404 no route, 405, 413 body too large) keep their status; PolarErrors map through
    ``status_for``; anything else is logged and answered 500.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, _http_message(exc, request))
        except PolarError as exc:
            status = status_for(exc)
            if status >= 500:
                log.error("%s: %s %s: %s", what, request.method, request.path, exc)
            return error_response(status, str(exc))
        except Exception as exc:
            log.exception("%s: internal error on %s %s", what, request.method, request.path)
            return error_response(500, f"internal {what} error: {type(exc).__name__}")

    return middleware


def _http_message(exc: web.HTTPException, request: web.Request) -> str:
    if exc.status == 404:
        return f"no such route: {request.method} {request.path}"
    if exc.status == 405:
        return f"method {request.method} is not allowed on {request.path}"
    if exc.status == 413:
        return f"request body too large ({exc.text or exc.reason})"
    return exc.text or exc.reason
