"""Retrying transient upstream failures within a time budget: capped, jittered exponential backoff.

Transient: connect errors, resets, truncated bodies, per-attempt timeouts and HTTP 429/500/502/503/504 (the backend
marks its BackendError ``retryable``; a 429's or 503's ``Retry-After`` is honoured). Every call runs within one
deadline (``time.monotonic()``): the earlier of the session's deadline (``call_deadline``, set by the proxy around a
backend call) and ``RetryConfig.total_s`` from the first try. Each attempt gets min(per-attempt timeout, time left);
a backoff sleep that would pass the deadline is not started: the call ends with a 504 instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from pydantic import Field

from polar_cli.errors import BackendError
from polar_cli.models import StrictModel

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})

_deadline: ContextVar[float | None] = ContextVar("polar_call_deadline", default=None)


class RetryConfig(StrictModel):
    """How hard to try an upstream call: ``attempts`` tries in all, sleeping base*2^n (capped, jittered) between,
    all within ``total_s`` seconds (and the session's deadline, if it has one)."""

    attempts: int = Field(default=4, ge=1)
    base_delay_s: float = Field(default=0.25, ge=0)
    max_delay_s: float = Field(default=8.0, ge=0)
    total_s: float = Field(default=900.0, gt=0, description="bound on one call, every attempt and sleep included")


@contextlib.contextmanager
def call_deadline(deadline: float | None) -> Iterator[None]:
    """Backend calls made inside run within ``deadline`` (``time.monotonic()``; None: no session deadline)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def current_deadline() -> float | None:
    return _deadline.get()


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def backoff_delay(config: RetryConfig, attempt: int, retry_after: float | None = None) -> float:
    """Seconds to wait before try ``attempt + 1`` (0-based ``attempt`` just failed). A server's Retry-After wins
    (bounded by the call's deadline, not by ``max_delay_s``); otherwise base*2^attempt capped, jittered."""
    if retry_after is not None:
        return max(retry_after, 0.0)
    delay = min(config.base_delay_s * (2**attempt), config.max_delay_s)
    # full jitter on the upper half keeps many sessions from retrying in lockstep
    return delay / 2 + random.random() * delay / 2


def _out_of_time(what: str, attempts: int, last: BackendError | None) -> BackendError:
    tail = f"; last error: {last}" if last is not None else ""
    return BackendError(f"{what}: no answer within the call's deadline ({attempts} attempts{tail})", status=504)


async def with_retries(
    call: Callable[[float], Awaitable[T]],
    config: RetryConfig,
    *,
    timeout_s: float,
    what: str = "backend",
    deadline: float | None = None,
) -> T:
    """Run ``call(budget_s)`` until it succeeds, fails for good, runs out of attempts or of time.

    ``budget_s`` is the attempt's timeout: min(``timeout_s``, time left to the deadline). A BackendError with
    ``retryable=True`` is retried (its ``retry_after`` honoured); the last error is re-raised when attempts run out,
    a 504 when the deadline would pass first."""
    start = time.monotonic()
    limit = start + config.total_s
    session_deadline = deadline if deadline is not None else _deadline.get()
    if session_deadline is not None:
        limit = min(limit, session_deadline)
    attempt = 0
    last: BackendError | None = None
    while True:
        left = limit - time.monotonic()
        if left <= 0:
            raise _out_of_time(what, attempt, last)
        try:
            return await call(min(timeout_s, left))
        except BackendError as exc:
            attempt += 1
            last = exc
            if not exc.retryable:
                raise
            if attempt >= config.attempts:
                if attempt > 1:
                    exc.args = (f"{exc} (after {attempt} attempts)",)
                raise
            delay = backoff_delay(config, attempt - 1, getattr(exc, "retry_after", None))
            if time.monotonic() + delay >= limit:
                raise _out_of_time(what, attempt, exc) from exc
            await asyncio.sleep(delay)
