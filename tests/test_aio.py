"""Deadlines that never lose a cancellation (``polar_cli.aio``), and that nothing in Polar uses
``asyncio.wait_for``, which on Python 3.11 drops a cancellation that lands as its awaitable completes."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from polar_cli.aio import wait_event, within
from polar_cli.runtimes.pool import SandboxPool, SandboxPoolConfig

ROOT = Path(__file__).resolve().parents[1]


async def cancelled_as_the_event_fires(wait: Callable[[asyncio.Event], Awaitable[object]]) -> bool:
    """A ``while True`` loop waiting on an event, cancelled in the loop turn after the event is set (the event's
    wait has completed, its waker has not run yet): whether the loop stopped."""
    event = asyncio.Event()

    async def loop() -> None:
        while True:
            await wait(event)
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    event.set()
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    task.cancel()  # a loop that lost the first one stops at its next wait
    await asyncio.gather(task, return_exceptions=True)
    return bool(done)


async def wait_within(event: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await within(event.wait(), 1.0)


@pytest.mark.parametrize("wait", [lambda e: wait_event(e, 1.0), wait_within], ids=["wait_event", "within"])
def test_a_cancellation_that_lands_as_the_wait_completes_stops_the_loop(
    wait: Callable[[asyncio.Event], Awaitable[object]],
) -> None:
    assert asyncio.run(cancelled_as_the_event_fires(wait))


def test_deadlines_and_results() -> None:
    async def body() -> None:
        event = asyncio.Event()
        assert await wait_event(event, 0.01) is False
        event.set()
        assert await wait_event(event, 0.01) is True
        assert await wait_event(event, None) is True
        assert await within(asyncio.sleep(0, "done"), 1.0) == "done"
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(10), 0.01)
        with pytest.raises(TimeoutError):
            await within(asyncio.Event().wait(), 0)
        never = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await within(asyncio.shield(never), 0.01)
        assert not never.cancelled()  # shielded: it outlives the deadline
        never.cancel()

    asyncio.run(body())


def test_the_sandbox_pool_closes_when_woken_as_it_closes() -> None:
    """The hang one CI run hit: the pool's sizing loop was cancelled by ``close()`` as a finished task woke it."""

    async def body() -> None:
        async with SandboxPool(SandboxPoolConfig(max=2, idle_seconds=30)) as pool:
            await asyncio.sleep(0.05)
            pool._wake.set()
            await asyncio.sleep(0)

    asyncio.run(within(body(), 10))


def test_nothing_uses_asyncio_wait_for() -> None:
    sources = [*ROOT.glob("polar_cli/**/*.py"), *ROOT.glob("plugins/*/polar_*/**/*.py")]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(", line)
    ]
    assert not found, "use polar_cli.aio (asyncio.wait_for drops cancellations on 3.11): " + ", ".join(found)
