"""SIGTERM (what ``kill`` and schedulers send) and SIGINT (Ctrl-C) as one exception, so a blocking command stops at
once and says what it leaves behind instead of dying silently (SIGTERM's default) or with a traceback."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """A stop signal arrived; ``exit_code`` is the shell's convention for it (128 + the signal number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGINT raise :class:`Stopped` in the main thread (a blocking socket read is
    interrupted too); the previous handlers come back afterwards."""
    previous = {signum: signal.signal(signum, _raise) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
