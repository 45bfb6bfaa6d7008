"""One call of the node protocol, as both clients make it: a bearer token, a model as the body, a typed Reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx
from pydantic import BaseModel

A = TypeVar("A", bound=BaseModel)


@dataclass(frozen=True)
class Reply(Generic[A]):
    """What one call brought back; the caller decides by ``status`` (its rules differ per call)."""

    status: int | None
    """The HTTP status; None when no answer came (the peer unreachable, the call timed out)."""
    answer: A | None = None
    """The parsed answer of a 2xx; None otherwise, or when it did not parse (``error`` says why)."""
    error: str = ""
    """The refusal's message (the error shape's ``error.message``), the transport error, or the parse error."""

    @property
    def ok(self) -> bool:
        """A 2xx came back (whether or not its answer parsed)."""
        return self.status is not None and 200 <= self.status < 300


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    token: str,
    answer: type[A],
    *,
    body: bytes | None = None,
    timeout: float | None = None,
) -> Reply[A]:
    """``method url`` with ``Authorization: Bearer token`` and ``body`` (JSON); never raises for what the peer did.
    ``timeout`` (seconds) replaces the client's own for this call (a pause may take minutes)."""
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        if timeout is None:
            response = await client.request(method, url, content=body, headers=headers)
        else:
            response = await client.request(method, url, content=body, headers=headers, timeout=timeout)
    except Exception as exc:  # whatever a peer's URL, token or answer makes a call raise is that peer's
        # error, never the caller's: every httpx error class (InvalidURL and CookieConflict are not HTTPErrors), an
        # encoding error (a non-ASCII token), an out-of-range port (an OverflowError inside an ExceptionGroup) ...
        return Reply(None, error=str(exc) or type(exc).__name__)
    if not response.is_success:
        return Reply(response.status_code, error=error_message(response))
    try:
        return Reply(response.status_code, answer.model_validate_json(response.content))
    except ValueError as exc:
        return Reply(response.status_code, error=f"{method} {url} answered {exc}")


def error_message(response: httpx.Response) -> str:
    """The message of a refusal in Polar's error shape, else the start of its body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
