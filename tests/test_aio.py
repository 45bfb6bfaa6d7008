"""Deadlines and task stops that never lose a cancellation (``polar_cli.aio``), and that nothing in Polar uses
``asyncio.wait_for``, which on Python 3.11 drops a cancellation that lands as its awaitable completes, or stops a task
with ``suppress(CancelledError)``, which swallows the caller's own cancellation too."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from polar_cli.aio import cancel_and_wait, wait_event, within
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


def test_cancel_and_wait_absorbs_the_tasks_cancellation_and_raises_the_callers() -> None:
    async def body() -> None:
        forever = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        await cancel_and_wait(forever)  # its own cancellation: absorbed
        assert forever.cancelled()

        async def failing() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                raise ValueError("its clean-up failed")

        broken = asyncio.create_task(failing())
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="clean-up failed"):  # any other end: raised
            await cancel_and_wait(broken)

        # the caller is cancelled while it waits for a task that takes its time to stop
        release = asyncio.Event()

        async def slow_to_stop() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                await release.wait()

        ran_on: list[str] = []

        async def closer(stop: Callable[[asyncio.Task[None]], Awaitable[None]], slow: asyncio.Task[None]) -> None:
            await stop(slow)
            ran_on.append("after the stop")

        async def suppressing(task: asyncio.Task[None]) -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        for stop, swallowed in ((suppressing, True), (cancel_and_wait, False)):
            ran_on.clear()
            slow = asyncio.create_task(slow_to_stop())
            await asyncio.sleep(0)
            release.clear()
            caller = asyncio.create_task(closer(stop, slow))
            await asyncio.sleep(0.01)
            caller.cancel()
            await asyncio.sleep(0.01)
            release.set()
            await asyncio.gather(caller, return_exceptions=True)
            assert caller.cancelled() is not swallowed and (ran_on == ["after the stop"]) is swallowed, stop

        # a clean-up on the way out of a cancellation runs to its end, and the cancellation goes on after it
        helper = asyncio.create_task(asyncio.sleep(3600))

        async def cancelled_worker() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                await cancel_and_wait(helper)
                ran_on.append("clean-up done")

        ran_on.clear()
        worker = asyncio.create_task(cancelled_worker())
        await asyncio.sleep(0)
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        assert worker.cancelled() and helper.cancelled() and ran_on == ["clean-up done"]

    asyncio.run(within(body(), 10))


GUARDS = {
    r"\basyncio\.wait_for\(": "use polar_cli.aio (asyncio.wait_for drops cancellations on 3.11)",
    r"suppress\((asyncio\.)?CancelledError": "use polar_cli.aio.cancel_and_wait (it keeps the caller's cancel)",
}


@pytest.mark.parametrize("pattern", list(GUARDS))
def test_nothing_uses_a_pattern_that_loses_cancellations(pattern: str) -> None:
    sources = [*ROOT.glob("polar_cli/**/*.py"), *ROOT.glob("plugins/*/polar_*/**/*.py")]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert not found, f"{GUARDS[pattern]}: " + ", ".join(found)
