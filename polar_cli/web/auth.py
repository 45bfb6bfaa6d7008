"""Control tokens: generation, where a command finds one, and the bearer guard (constant-time, safe on any header
bytes) in front of every control route."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from aiohttp import web

from polar_cli.errors import AuthError
from polar_cli.web.errors import Handler

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


def token_digest(token: str) -> bytes:
    """A token's SHA-256, for finding which of many tokens a request carries with one set lookup: what a lookup's
    timing could tell is about the digest, never the token."""
    return hashlib.sha256(header_bytes(token)).digest()


def check_bearer(request: web.Request, token: str, what: str, token_name: str = "control token") -> None:
    """AuthError (401) unless the request carries ``token``; a missing token and a wrong one read differently."""
    if bearer_token(request) is None:
        raise AuthError(f"{what} needs its {token_name}: send it as Authorization: Bearer <{token_name}>")
    if not bearer_matches(request, token):
        raise AuthError(f"wrong {token_name}: {what} does not accept the bearer token sent")


def guarded(token: str, what: str, handler: Handler, token_name: str = "control token") -> Handler:
    """``handler`` behind the bearer guard: without the token it is never called (401)."""

    async def wrapper(request: web.Request) -> web.StreamResponse:
        check_bearer(request, token, what, token_name)
        return await handler(request)

    return wrapper
