"""The durable result store and the stage queue."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar_cli.errors import SessionError
from polar_cli.gateway import ResultStore
from polar_cli.gateway.queues import StageQueue
from polar_cli.models import SessionResult, Trajectory


def result(session_id: str, status: str = "completed", reward: float | None = 1.0) -> SessionResult:
    return SessionResult(
        session_id=session_id,
        status=status,  # type: ignore[arg-type]
        trajectory=Trajectory(status=status, session_id=session_id),  # type: ignore[arg-type]
        reward=reward,
    )


def test_store_round_trip_overwrite_and_listing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    assert store.session_ids() == []
    path = store.write(result("a"))
    assert path == tmp_path / "results" / "a.json"
    store.write(result("b", "timeout", 0.0))
    store.write(result("a", "error", None))  # replaced atomically
    assert store.read("a") == result("a", "error", None)
    assert store.session_ids() == ["a", "b"]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["a.json", "b.json"]  # no temp files


def test_store_refuses_path_like_ids_and_reports_missing_results(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(SessionError, match="invalid session id"):
            store.path(bad)
    with pytest.raises(SessionError, match="no result for session 'missing'"):
        store.read("missing")


def test_a_failed_write_leaves_the_previous_result_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ResultStore(tmp_path)
    store.write(result("a"))

    def disk_full(src: str, dst: str) -> None:  # a failing disk cannot be had on demand: simulate the rename failing
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("polar_cli.gateway.results.os.replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        store.write(result("a", "error", None))
    assert store.read("a") == result("a")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_stage_queue_bounds_puts_and_lets_a_waiting_item_be_removed() -> None:
    async def body() -> None:
        queue: StageQueue[str] = StageQueue(capacity=1)
        await queue.put("a")
        blocked = asyncio.create_task(queue.put("b"))
        await asyncio.sleep(0)
        assert not blocked.done() and len(queue) == 1 and queue.full()
        assert await queue.remove("a") is True  # room again: the blocked put goes through
        await blocked
        assert await queue.remove("zzz") is False
        assert await queue.get() == "b"
        getter = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        assert not getter.done()
        await queue.put("c")
        assert await getter == "c"
        unbounded: StageQueue[int] = StageQueue()
        for i in range(100):
            await unbounded.put(i)
        assert len(unbounded) == 100 and not unbounded.full()

    asyncio.run(body())
