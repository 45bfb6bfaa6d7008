"""SIGTERM (what ``kill`` and schedulers send) stops a command exactly like Ctrl-C, and the command gets one exception,
:class:`Interrupted`, to say in one line what was kept and how to go on: ``run_until_stopped`` for a command that runs
an event loop (its main task is cancelled and everything under it unwinds: sessions cancelled, their results kept),
``stop_on_signals`` for one that blocks in plain calls (the signal interrupts a blocking socket read)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """The command was stopped by ``signum``; exit with ``exit_code`` (128 + the signal, as a shell reports it).

    A :class:`BaseException`, as :class:`KeyboardInterrupt` is: ``stop_on_signals`` raises it wherever the main thread
    is, and an ``except Exception`` there (``socketserver`` has one around starting a request's thread) must not
    swallow the stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def run_until_stopped(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where SIGINT and SIGTERM cancel ``main`` (a second signal cancels its clean-up too);
    raises :class:`Interrupted` once it has unwound."""
    received: list[int] = []

    async def guarded() -> T:
        current = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if current is not None:
            for signum in STOP_SIGNALS:

                def stop(signum: int = signum) -> None:
                    received.append(signum)
                    current.cancel()

                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signum, stop)
        return await main

    try:
        return asyncio.run(guarded())
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise Interrupted(received[0] if received else signal.SIGINT) from None


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGINT raise :class:`Interrupted` in the main thread; the previous handlers come
    back afterwards."""
    previous = {signum: signal.signal(signum, _raise) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
