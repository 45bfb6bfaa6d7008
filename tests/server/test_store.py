"""The store's state machine: idempotent submit, 409 on a different body, attempts, exactly-once finish, the outbox
(a task's status after its session results), and a reopen on the same file (what a server restart sees)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from polar_cli.errors import SessionExistsError
from polar_cli.models import SessionResult, TaskRequest, Trajectory
from polar_cli.server.store import SQLiteStore


def make_task(task_id: str = "t1", samples: int = 2, callback_url: str | None = "http://127.0.0.1:9/cb") -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="do it", num_samples=samples, agent={"harness": "shell"},
                       callback_url=callback_url)  # fmt: skip


def result(session_id: str, status: str = "completed") -> SessionResult:
    return SessionResult(session_id=session_id, task_id="t1", status=status, trajectory=Trajectory(status=status))  # type: ignore[arg-type]


def test_submit_is_idempotent_and_a_different_body_conflicts(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    first = store.submit(make_task(), ["a", "b"])
    again = store.submit(make_task(), ["c", "d"])  # new ids are ignored: the stored task is the one
    assert (first.created, again.created, again.state) == (True, False, "pending")
    assert list(store.task_status("t1").sessions) == ["a", "b"]
    with pytest.raises(SessionExistsError) as caught:
        store.submit(make_task(samples=3), ["x", "y", "z"])
    assert caught.value.http_status == 409
    assert store.task("t1").num_samples == 2


def test_a_session_finishes_exactly_once_and_the_task_ends_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task(), ["a", "b"])
    assert store.dispatch("a", "n1") == 1
    assert store.dispatch("a", "n2") is None  # not pending any more
    assert store.task_status("t1").state == "running"
    assert store.finish("a", result("a")).accepted
    assert not store.finish("a", result("a", "error")).accepted  # a late or repeated result is ignored
    assert store.result("a") == result("a")
    store.dispatch("b", "n2")
    ended = store.finish("b", result("b", "timeout"))
    assert ended.accepted and ended.task_ended
    status = store.task_status("t1")
    assert (status.state, status.completed, status.failed, len(status.results)) == ("completed", 1, 1, 2)
    due = store.due_callbacks(now=1e12)
    assert [c.key for c in due] == ["session_result:a", "session_result:b"]  # the status waits for both
    store.callback_delivered(due[0].id)
    assert store.pending_callbacks() == 2
    store.callback_failed(due[1].id, next_at=5e12, error="HTTP 500")  # refused: retried later, the status with it
    assert store.due_callbacks(now=1e12) == [] and store.next_callback_at() == 5e12
    store.callback_delivered(due[1].id)
    assert [c.key for c in store.due_callbacks(now=1e12)] == ["task_status:t1"]


def test_lost_attempts_are_retried_then_fail_naming_why(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task(samples=1, callback_url=None), ["a"])
    assert store.dispatch("a", "n1") == 1
    store.undo_dispatch("a", 1)  # the call never reached the node: not an attempt
    assert store.session("a").state == "pending" and store.session("a").attempt == 0
    assert store.dispatch("a", "n1") == 1
    assert store.requeue("a", 1, "node n1 stopped heartbeating", max_attempts=2) is not None
    assert store.session("a").state == "pending"
    assert store.requeue("a", 1, "stale", max_attempts=2) is None  # only the current attempt can be lost
    assert store.dispatch("a", "n2") == 2
    store.mark_running("n2", ["a"])
    assert store.session("a").state == "running"
    outcome = store.requeue("a", 2, "node n2 stopped heartbeating", max_attempts=2)
    assert outcome is not None and outcome.accepted and outcome.task_ended
    final = store.result("a")
    assert final is not None and final.status == "error"
    assert "node n2 stopped heartbeating (attempt 2 of 2" in (final.error or "")
    assert store.task_status("t1").state == "failed"
    assert store.due_callbacks(now=1e12) == []  # no callback_url, no outbox


def test_cancel_and_reopen(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task(samples=3), ["a", "b", "c"])
    store.dispatch("a", "n1")
    store.finish("a", result("a"))
    store.dispatch("b", "n1")
    held = store.cancel_task("t1")
    assert [row.session_id for row in held] == ["b"]
    assert not store.finish("b", result("b")).accepted
    store.set_meta("token", "secret")
    store.upsert_node("n1", "http://127.0.0.1:1", "tok", 4)
    store.close()
    reopened = SQLiteStore(tmp_path / "s.db")
    status = reopened.task_status("t1")
    assert status.state == "cancelled"
    assert status.sessions == {"a": "finished", "b": "cancelled", "c": "cancelled"}
    assert [r.status for r in status.results] == ["completed", "cancelled", "cancelled"]
    assert reopened.meta("token") == "secret" and reopened.node("n1") is not None
    assert [c.key for c in reopened.due_callbacks(now=1e12)] == ["session_result:a"]  # then the status


def test_sessions_by_state_and_finished_since(tmp_path: Path) -> None:
    """``GET /rollout/status`` counts sessions by state and, from the commit times, those finished in each window."""
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task(samples=3, callback_url=None), ["a", "b", "c"])
    store.dispatch("a", "n1")
    store.dispatch("b", "n1")
    store.mark_running("n1", ["b"])
    assert store.session_counts() == {"pending": 1, "dispatched": 1, "running": 1}
    assert store.finished_since([0.0]) == [0]
    before = time.time()
    store.finish("b", result("b"))
    assert store.session_counts() == {"pending": 1, "dispatched": 1, "finished": 1}
    assert store.finished_since([before - 60, before, time.time() + 60]) == [1, 1, 0]
    assert store.finished_since([]) == []


def test_ended_tasks_are_those_that_ended_since_a_time_in_submission_order(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    for task_id in ("t1-late", "t2-open", "t3-cancelled"):
        store.submit(make_task(task_id, samples=1), [f"{task_id}-0"])
    store.cancel_task("t3-cancelled")
    between = time.time()
    store.dispatch("t1-late-0", "n1")
    store.finish("t1-late-0", result("t1-late-0"))
    assert store.ended_tasks(0.0) == ["t1-late", "t3-cancelled"]  # submitted in that order; t2-open has not ended
    assert store.ended_tasks(between) == ["t1-late"]
    assert store.ended_tasks(time.time() + 60) == []
