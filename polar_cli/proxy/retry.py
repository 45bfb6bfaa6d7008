"""Retrying transient upstream failures (connect errors, 429, 502/503/504) with capped exponential backoff."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import Field

from polar_cli.errors import BackendError
from polar_cli.models import StrictModel

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


class RetryConfig(StrictModel):
    """How hard to try an upstream call: ``attempts`` tries in all, sleeping base*2^n (capped, jittered) between."""

    attempts: int = Field(default=4, ge=1)
    base_delay_s: float = Field(default=0.25, ge=0)
    max_delay_s: float = Field(default=8.0, ge=0)


def backoff_delay(config: RetryConfig, attempt: int, retry_after: float | None = None) -> float:
    """Seconds to wait before try ``attempt + 1`` (0-based ``attempt`` just failed); honours Retry-After, capped."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), config.max_delay_s)
    delay = min(config.base_delay_s * (2**attempt), config.max_delay_s)
    # full jitter on the upper half keeps many sessions from retrying in lockstep
    return delay / 2 + random.random() * delay / 2


async def with_retries(call: Callable[[], Awaitable[T]], config: RetryConfig) -> T:
    """Run ``call``; a BackendError with ``retryable=True`` is retried until the attempts run out, then re-raised."""
    attempt = 0
    while True:
        try:
            return await call()
        except BackendError as exc:
            attempt += 1
            if not exc.retryable or attempt >= config.attempts:
                if exc.retryable and attempt > 1:
                    exc.args = (f"{exc} (after {attempt} attempts)",)
                raise
            await asyncio.sleep(backoff_delay(config, attempt - 1, getattr(exc, "retry_after", None)))
