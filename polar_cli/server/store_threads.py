"""Store calls off the event loop: the SQLite work of 10,000 sessions in flight must never stall a request.

Writes run, in the order they are asked for, on one dedicated thread (its own connection: transactions never wait on
each other); reads run on a small pool of other threads (each with its own connection; in WAL mode a reader never
waits for the writer). ``await threads.write(store.finish, ...)`` returns once the transaction has committed, so a
result is still committed before the gateway's report is acknowledged.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
READERS = 2


class StoreThreads:
    """``await threads.read(fn, ...)`` / ``await threads.write(fn, ...)`` run ``fn(...)`` on a store thread."""

    def __init__(self, readers: int = READERS) -> None:
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="polar-store-writer")
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="polar-store-reader")

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, functools.partial(fn, *args, **kwargs))

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Wait for the calls under way (a transaction is never cut short), then stop the threads."""
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
