"""The start-up check of a gateway's inference backend, which tells a dead backend from a busy one.

A backend that refuses the connection, is unknown to DNS, unreachable, or answers an HTTP error (404, 401, 500) fails
the check at once. One that took the connection but answers slowly, or answers 503 (busy, loading), is asked again
with backoff until ``wait_s`` seconds have passed: a vLLM under load is alive, not dead. Each probe waits
``PROBE_S`` seconds for its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time

from polar_cli.backoff import Backoff
from polar_cli.errors import BackendBusy, BackendError
from polar_cli.interfaces.backend import BackendClient

PROBE_S = 5.0
"""How long one probe of the backend waits for its answer."""
RETRY = Backoff(initial_s=1.0, max_s=15.0, timeout_s=PROBE_S)

log = logging.getLogger(__name__)


async def check_backend(
    backend: BackendClient, *, wait_s: float, token_in: bool = False, retry: Backoff = RETRY
) -> None:
    """Return once ``backend`` answers (and has its token-in routes when ``token_in``); BackendError when it
    cannot be reached or refuses, or when it is still busy after ``wait_s`` seconds. The note that it waits quotes
    the first busy answer, which names the backend's URL."""
    started = time.monotonic()
    failures = 0
    while True:
        try:
            await backend.preflight(retry.timeout_s)
            if token_in:
                await backend.check_token_in(retry.timeout_s)
            return
        except BackendBusy as exc:
            failures += 1
            left = wait_s - (time.monotonic() - started)
            if left <= 0:
                raise BackendError(f"{exc} (still busy after {wait_s:g} s, --backend-check-timeout)") from exc
            if failures == 1:
                log.warning("waiting up to %g s for a busy backend: %s", wait_s, exc)
            await asyncio.sleep(min(retry.delay(failures), left))
