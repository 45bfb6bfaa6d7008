"""Group commit in the store's writer thread: queued writes share one transaction (one fsync), each in its own
savepoint, so a failing call fails only its own caller and undoes only its own changes; every caller is answered
only once the transaction holding its write has committed."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from polar_cli.errors import SessionExistsError
from polar_cli.models import TaskRequest
from polar_cli.server.store import SQLiteStore, Submitted
from polar_cli.server.store_threads import StoreThreads


def make_task(task_id: str, samples: int = 2) -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="do it", num_samples=samples, agent={"harness": "shell"})


def test_queued_writes_commit_together_and_a_failing_one_fails_alone(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    store.submit(make_task("taken"), ["taken-0", "taken-1"])
    threads = StoreThreads(store=store)
    gate = threading.Event()
    calls = 50

    def half_then_fail() -> None:
        store.set_meta("partial", "must be undone")  # written in the group's transaction, then rolled back
        raise ValueError("this call fails")

    def visible_elsewhere(task_id: str) -> str:
        """What a fresh connection (another process, a restart) sees of a task: committed state only."""
        other = SQLiteStore(path)
        try:
            return other.task_state(task_id)
        finally:
            other.close()

    async def main() -> list[object]:
        blocker = asyncio.ensure_future(threads.write(gate.wait, 10))  # holds the writer: the rest queue up
        await asyncio.sleep(0.05)
        writes: list[asyncio.Future[object]] = []
        for i in range(calls):
            if i == 10:
                writes.append(asyncio.ensure_future(threads.write(half_then_fail)))
            elif i == 20:  # the same task id with a different body: 409, this caller only
                writes.append(asyncio.ensure_future(threads.write(store.submit, make_task("taken", 3), ["x"] * 3)))
            else:
                writes.append(
                    asyncio.ensure_future(threads.write(store.submit, make_task(f"t{i}"), [f"s{i}-0", f"s{i}-1"]))
                )
        writes.append(asyncio.ensure_future(threads.write(store.set_meta, "last", "yes")))
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in writes)  # queued behind the blocker
        gate.set()
        assert await blocker is True
        first = await writes[0]
        assert isinstance(first, Submitted)
        assert visible_elsewhere("t0") == "pending"  # acknowledged => committed
        return list(await asyncio.gather(*writes, return_exceptions=True))

    outcomes = asyncio.run(main())
    threads.close()
    assert threads.writes == calls + 2
    assert threads.transactions < calls  # grouped: the blocker alone, then the 51 queued in one transaction
    assert threads.transactions == 2
    assert isinstance(outcomes[10], ValueError)
    assert isinstance(outcomes[20], SessionExistsError)
    ok = [i for i in range(calls) if i not in (10, 20)]
    for i in ok:
        assert outcomes[i] == Submitted(f"t{i}", "pending", created=True)
    assert outcomes[calls] is None
    store.close()

    reopened = SQLiteStore(path)
    for i in ok:
        assert reopened.task_state(f"t{i}") == "pending"
        assert list(reopened.task_status(f"t{i}").sessions) == [f"s{i}-0", f"s{i}-1"]
    assert reopened.task("taken").num_samples == 2  # the refused submit changed nothing
    assert reopened.meta("partial") is None  # the failed call's own write was rolled back with its savepoint
    assert reopened.meta("last") == "yes"
    reopened.close()


def test_a_write_alone_and_a_write_after_close(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    threads = StoreThreads(store=store)

    async def main() -> None:
        assert (await threads.write(store.submit, make_task("a"), ["a0", "a1"])).created
        with pytest.raises(SessionExistsError):
            await threads.write(store.submit, make_task("a", 3), ["x", "y", "z"])
        assert await threads.read(store.task_state, "a") == "pending"

    asyncio.run(main())
    threads.close()
    assert (threads.writes, threads.transactions) == (2, 2)

    async def late() -> None:
        with pytest.raises(RuntimeError):
            await threads.write(store.set_meta, "k", "v")

    asyncio.run(late())
    store.close()


def test_the_writes_of_one_event_loop_tick_share_one_transaction(tmp_path: Path) -> None:
    """An idle writer does not take the first write of a tick alone: the tick's writes reach it as one batch."""
    store = SQLiteStore(tmp_path / "s.db")
    threads = StoreThreads(store=store)

    async def submit(i: int) -> Submitted:
        time.sleep(0.002)  # the GIL let go between the tick's writes: an idle writer would take the first alone
        return await threads.write(store.submit, make_task(f"t{i}"), [f"t{i}-0", f"t{i}-1"])

    async def main() -> list[Submitted]:
        return await asyncio.gather(*(submit(i) for i in range(40)))  # each runs its first step in one tick

    outcomes = asyncio.run(main())
    threads.close()
    assert [o.created for o in outcomes] == [True] * 40
    assert (threads.writes, threads.transactions) == (40, 1)
    assert store.task_counts() == {"pending": 40}
    store.close()
