"""Store calls off the event loop: the SQLite work of 10,000 sessions in flight must never stall a request.

Writes run, in the order they are asked for, on one dedicated thread (its own connection: transactions never wait on
each other); reads run on a small pool of other threads (each with its own connection; in WAL mode a reader never
waits for the writer). ``await threads.write(store.finish, ...)`` returns once the transaction has committed, so a
result is still committed before the gateway's report is acknowledged.

Batched per event-loop tick: the writes asked for during one tick of the event loop are handed to the writer thread
together (one hand-off, scheduled with ``call_soon``), and when the store can group them (:class:`GroupCommit`) they
run in ONE transaction, so one fsync, each call in its own savepoint: a call that raises undoes its own changes only
and fails only its own caller. Writes of later ticks that are queued by the time the writer takes the next batch join
the same transaction (group commit), up to ``max_group`` calls. Every caller of the group is answered once the
group's transaction has committed (or, should the commit itself fail, they all get that error: nothing of the group
was committed).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

P = ParamSpec("P")
T = TypeVar("T")
READERS = 2
MAX_GROUP = 256
"""The most write calls one group transaction holds."""


@runtime_checkable
class GroupCommit(Protocol):
    """A store that can run several write calls in one transaction (see ``SQLiteStore.group``)."""

    def group(self) -> AbstractContextManager[None]: ...
    def savepoint(self) -> AbstractContextManager[None]: ...


_Call = tuple[Callable[[], Any], Future[Any]]


class StoreThreads:
    """``await threads.read(fn, ...)`` / ``await threads.write(fn, ...)`` run ``fn(...)`` on a store thread.

    With ``store`` given (a :class:`GroupCommit`), queued writes are group-committed; ``transactions`` counts the
    transactions the writer thread ran (a write alone is one; a group of several is one)."""

    def __init__(self, readers: int = READERS, *, store: object | None = None, max_group: int = MAX_GROUP) -> None:
        self._group = store if isinstance(store, GroupCommit) else None
        self._max_group = max(1, max_group)
        self._queue: queue.SimpleQueue[list[_Call] | None] = queue.SimpleQueue()
        self._tick: list[_Call] = []
        """The writes asked for in this event-loop tick, handed to the writer thread together at its end."""
        self._closed = False
        self._close_lock = threading.Lock()
        self.transactions = 0
        self.writes = 0
        self._writer = threading.Thread(target=self._write_loop, name="polar-store-writer", daemon=True)
        self._writer.start()
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="polar-store-reader")

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        future: Future[T] = Future()
        with self._close_lock:
            if self._closed:
                raise RuntimeError("the store threads are closed")
            if not self._tick:
                asyncio.get_running_loop().call_soon(self._hand_off)
            self._tick.append((functools.partial(fn, *args, **kwargs), future))
        return await asyncio.wrap_future(future)

    def _hand_off(self) -> None:
        """The end of a tick: this tick's writes go to the writer thread as one batch."""
        with self._close_lock:
            calls, self._tick = self._tick, []
            if calls:
                self._queue.put(calls)

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Wait for the calls under way and queued (a transaction is never cut short), then stop the threads."""
        with self._close_lock:
            if not self._closed:
                self._closed = True
                if self._tick:  # asked for before the close: they run (their hand-off finds nothing left)
                    self._queue.put(self._tick)
                    self._tick = []
                self._queue.put(None)
        self._writer.join()
        self._readers.shutdown(wait=True)

    # ---- the writer thread --------------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            calls = list(first)  # one tick's writes are never split
            while len(calls) < self._max_group:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                calls.extend(nxt)
            calls = [(fn, fut) for fn, fut in calls if fut.set_running_or_notify_cancel()]
            if not calls:
                continue
            self.writes += len(calls)
            self.transactions += 1
            if len(calls) == 1 or self._group is None:
                for fn, fut in calls:  # no group: each call its own transaction(s), as the store makes them
                    self._run_alone(fn, fut)
            else:
                self._run_group(self._group, calls)

    @staticmethod
    def _run_alone(fn: Callable[[], Any], fut: Future[Any]) -> None:
        try:
            result = fn()
        except BaseException as e:
            fut.set_exception(e)
        else:
            fut.set_result(result)

    @staticmethod
    def _run_group(store: GroupCommit, calls: list[_Call]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            with store.group():
                for fn, _ in calls:
                    try:
                        with store.savepoint():
                            outcomes.append((True, fn()))
                    except Exception as e:
                        outcomes.append((False, e))
        except BaseException as e:
            for _, fut in calls:
                fut.set_exception(e)
            return
        for (ok, value), (_, fut) in zip(outcomes, calls, strict=True):  # answered only now: committed
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
