"""Trainer callbacks: each SessionResult and the final TaskStatus go to the task's ``callback_url``, at least once.

Entries come from the store's outbox (written in the same transaction as the result), so a restart drops nothing.
Each POST carries ``Idempotency-Key`` (``session_result:<session_id>`` or ``task_status:<task_id>``); failures are
retried with exponential backoff until the receiver answers 2xx.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

from polar_cli.aio import wait_event
from polar_cli.backoff import Backoff
from polar_cli.metrics import ServerMetrics
from polar_cli.server.store import Callback, SessionStore
from polar_cli.server.store_threads import StoreThreads

log = logging.getLogger(__name__)
BATCH = 32


def callback_payload(store: SessionStore, callback: Callback) -> dict[str, Any]:
    """The JSON a receiver gets, built from the store when sent (the outbox keeps no copy of the result)."""
    if callback.kind == "session_result":
        assert callback.session_id is not None
        result = store.result(callback.session_id)
        return {
            "type": "session_result",
            "task_id": callback.task_id,
            "session_id": callback.session_id,
            "result": None if result is None else result.model_dump(mode="json"),
        }
    status = store.task_status(callback.task_id)
    return {"type": "task_status", "task_id": callback.task_id, "status": status.model_dump(mode="json")}


class CallbackSender:
    """Delivers due outbox entries; :meth:`wake` after queueing new ones."""

    def __init__(self, store: SessionStore, backoff: Backoff, client: httpx.AsyncClient, threads: StoreThreads) -> None:
        self.store = store
        self.backoff = backoff
        self.client = client
        self.threads = threads
        self.metrics: ServerMetrics | None = None
        """Where each POST is counted, delivered or failed (the server's)."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            due = await self.threads.read(self.store.due_callbacks, time.time(), BATCH)
            if due:
                await asyncio.gather(*(self._deliver(cb) for cb in due))
                continue
            upcoming = await self.threads.read(self.store.next_callback_at)
            timeout = None if upcoming is None else max(0.01, upcoming - time.time())
            await wait_event(self._wake, timeout)

    async def _deliver(self, callback: Callback) -> None:
        try:
            payload = await self.threads.read(callback_payload, self.store, callback)
            response = await self.client.post(
                callback.url, json=payload, timeout=self.backoff.timeout_s, headers={"Idempotency-Key": callback.key}
            )
            if response.is_success:
                await self.threads.write(self.store.callback_delivered, callback.id)
                self._count(callback, "delivered")
                return
            error = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        self._count(callback, "failed")
        delay = self.backoff.delay(callback.attempts + 1)
        log.info("callback %s to %s failed (%s); retrying in %.1f s", callback.key, callback.url, error, delay)
        await self.threads.write(self.store.callback_failed, callback.id, time.time() + delay, error)

    def _count(self, callback: Callback, result: str) -> None:
        if self.metrics is not None:
            self.metrics.callbacks.labels(callback.kind, result).inc()
