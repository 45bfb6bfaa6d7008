"""Asyncio waits with a deadline that never lose a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the inner result when its caller is cancelled in the same loop turn
as the inner awaitable completes: the cancellation is dropped (python/cpython#86296, fixed in 3.12). A loop such as
``while True: await wait_for(event.wait(), tick)`` then keeps running after ``task.cancel()``, and whoever awaits
the cancelled task waits forever. ``asyncio.timeout`` counts cancellations and cannot drop one; every deadline in
Polar goes through it, by way of ``within`` and ``wait_event``.

The same care applies to stopping a helper task: ``task.cancel()``, then ``await task`` inside a
``contextlib.suppress`` of ``CancelledError``, also swallows a cancellation of the *caller* that lands while it
waits. ``cancel_and_wait`` absorbs only the task's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """``await awaitable``, or ``TimeoutError`` once ``seconds`` pass (``None``: no deadline). A coroutine is
    cancelled at the deadline; wrap a future that must survive it in ``asyncio.shield``."""
    async with asyncio.timeout(seconds):
        return await awaitable


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; whether it is set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has finished.

    Its own ``CancelledError`` is absorbed, and any other error it ended with is raised. A cancellation of the caller
    that arrives while it waits is raised too (the caller's ``cancelling()`` count went up), where suppressing
    ``CancelledError`` around ``await task`` would swallow it and the caller would run on. A caller already being
    cancelled when it comes here (a ``finally`` on the way out) is not stopped by that older cancellation: it goes on
    with its clean-up, and the cancellation goes on unwinding after it."""
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise
