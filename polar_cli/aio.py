"""Asyncio waits with a deadline that never lose a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the inner result when its caller is cancelled in the same loop turn
as the inner awaitable completes: the cancellation is dropped (python/cpython#86296, fixed in 3.12). A loop such as
``while True: await wait_for(event.wait(), tick)`` then keeps running after ``task.cancel()``, and whoever awaits
the cancelled task waits forever. ``asyncio.timeout`` counts cancellations and cannot drop one; every deadline in
Polar goes through it, by way of these two helpers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

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
