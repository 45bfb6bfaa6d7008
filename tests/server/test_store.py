"""The store's state machine: idempotent submit, 409 on a different body, attempts, exactly-once finish, the outbox
(a task's status after its session results), and a reopen on the same file (what a server restart sees)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from polar_cli.errors import SessionExistsError
from polar_cli.models import Placement, SessionResult, TaskRequest, Trajectory
from polar_cli.server.store import NodeRow, SQLiteStore


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


def _scanned(store: SQLiteStore) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
    """The counts the running counters stand for, computed by scanning the tables."""
    db = store._db
    sessions = dict(db.execute("SELECT state, COUNT(*) FROM sessions GROUP BY state").fetchall())
    tasks = dict(db.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall())
    assigned = dict(db.execute("SELECT node_id, COUNT(*) FROM sessions WHERE state IN ('dispatched', 'running') "
                               "GROUP BY node_id").fetchall())  # fmt: skip
    undelivered = db.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0]
    return sessions, tasks, assigned, undelivered


def _counted(store: SQLiteStore) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
    return (dict(store.session_counts()), dict(store.task_counts()), store.assigned_counts(),
            store.pending_callbacks())  # fmt: skip


def test_running_counters_match_the_tables_through_every_change_and_a_rolled_back_savepoint(tmp_path: Path) -> None:
    """Status and dispatch read running counters (no scan of every session): they stay equal to a scan through
    submit, dispatch, undo, heartbeat, requeue, finish, cancel, callbacks, and a savepoint rolled back."""
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task("t1", 4), ["a", "b", "c", "d"])
    store.submit(make_task("t2", 2, callback_url=None), ["e", "f"])
    assert _counted(store) == _scanned(store) == ({"pending": 6}, {"pending": 2}, {}, 0)
    attempts = store.dispatch_many([("a", "n1"), ("b", "n1"), ("c", "n2"), ("e", "n2")])
    assert _counted(store) == _scanned(store)
    assert store.assigned_counts() == {"n1": 2, "n2": 2}
    store.mark_running("n1", ["a"])
    store.undo_dispatch("c", attempts[2] or 0)
    store.requeue("b", 1, "lost", max_attempts=3)
    assert _counted(store) == _scanned(store)
    assert store.assigned_counts() == {"n1": 1, "n2": 1}
    store.finish("a", result("a"))
    store.report("e", "n2", 1, result("e"), max_attempts=3)
    with pytest.raises(RuntimeError), store.group():  # a group whose call fails: its savepoint, then all, undone
        with store.savepoint():
            store.finish("f", result("f"))
        raise RuntimeError("the group fails")
    assert _counted(store) == _scanned(store)
    store.cancel_task("t1")
    for callback in store.due_callbacks(now=1e12):
        store.callback_delivered(callback.id)
    assert _counted(store) == _scanned(store)
    store.close()

    reopened = SQLiteStore(tmp_path / "s.db")
    assert _counted(reopened) == _scanned(reopened)
    reopened.close()


def test_a_database_made_before_the_counters_is_counted_when_first_opened(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task("t1", 3), ["a", "b", "c"])
    store.dispatch("a", "n1")
    store.finish("b", result("b"))
    expected = _scanned(store)
    db = store._db
    for trigger in ("sessions_counted", "sessions_recounted", "tasks_counted", "tasks_recounted", "outbox_counted",
                    "outbox_recounted"):  # fmt: skip
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute("DROP TABLE counters")
    db.execute("DROP TABLE task_counters")
    db.execute("DELETE FROM meta WHERE key = 'counters'")
    store.close()

    reopened = SQLiteStore(tmp_path / "s.db")
    assert _counted(reopened) == expected
    reopened.dispatch("c", "n2")
    assert _counted(reopened) == _scanned(reopened)
    assert reopened.task_status("t1").state == "running"
    reopened.close()


def test_status_counts_cost_the_same_at_ten_sessions_and_at_ten_thousand(tmp_path: Path) -> None:
    """What ``GET /rollout/status``, the metrics and dispatch read is O(1) in the sessions stored: the SQLite
    instructions each read runs (counted by a progress handler) do not grow with them."""
    store = SQLiteStore(tmp_path / "s.db")

    def steps() -> int:
        ran = 0

        def count() -> int:
            nonlocal ran
            ran += 1
            return 0

        store._db.set_progress_handler(count, 1)
        try:
            store.session_counts(), store.task_counts(), store.assigned_counts(), store.pending_callbacks()
            store.count_sessions("pending")
        finally:
            store._db.set_progress_handler(None, 1)
        return ran

    def load(prefix: str, tasks: int, samples: int) -> None:
        for t in range(tasks):
            ids = [f"{prefix}{t}-{i}" for i in range(samples)]
            store.submit(make_task(f"{prefix}{t}", samples), ids)
            store.dispatch_many([(sid, f"n{i % 4}") for i, sid in enumerate(ids[: samples // 2])])
            store.finish(ids[0], result(ids[0]))

    load("small", 2, 8)  # the same nodes and states as below: only the number of sessions differs
    small = steps()
    load("big", 10, 1000)
    assert store.count_sessions("dispatched") == 2 * 3 + 10 * 499
    assert steps() < 2 * small  # scanning them: over 1,000 times as many
    store.close()


def test_a_heartbeat_misses_only_the_sessions_sent_before_it_could_list_them(tmp_path: Path) -> None:
    """A session dispatched after ``sent_before`` may have reached the node after it wrote its heartbeat: it is not
    ``missing`` (looked up) yet; one dispatched before is."""
    store = SQLiteStore(tmp_path / "s.db")
    store.submit(make_task("t1", 3), ["a", "b", "c"])
    store.dispatch_many([("a", "n1"), ("b", "n1")])
    between = time.time()
    time.sleep(0.01)
    store.dispatch("c", "n1")
    check = store.check_held("n1", ["a"], between)
    assert [row.session_id for row in check.missing] == ["b"]
    assert [row.session_id for row in store.check_held("n1", ["a"]).missing] == ["b", "c"]
    assert store.check_held("n1", ["a", "zzz"], between).cancel == ["zzz"]
    store.close()


def test_a_database_from_before_node_placements_opens_and_keeps_its_nodes(tmp_path: Path) -> None:
    """``nodes.placement`` came later: a database made without it gets the column when it opens, its nodes read
    back without a placement, and a register then records one."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # the nodes table as released before the column
        old.execute(
            "CREATE TABLE nodes (node_id TEXT PRIMARY KEY, url TEXT NOT NULL, token TEXT NOT NULL, "
            "run_slots INTEGER NOT NULL, draining INTEGER NOT NULL DEFAULT 0, registered_at REAL NOT NULL)"
        )
        old.execute("INSERT INTO nodes VALUES ('n-old', 'http://127.0.0.1:1', 'tok', 4, 1, 0)")
    old.close()
    store = SQLiteStore(path)
    assert store.node("n-old") == NodeRow("n-old", "http://127.0.0.1:1", "tok", 4, True, None)
    where = Placement(host="node017", scheduler="slurm", job_id="4242", step_id="0")
    store.upsert_node("n-old", "http://127.0.0.1:2", "tok2", 8, where)
    store.upsert_node("n-new", "http://127.0.0.1:3", "tok3", 2)
    store.close()
    reopened = SQLiteStore(path)  # the column is there now: opening again adds nothing
    assert [(n.node_id, n.url, n.draining, n.placement) for n in reopened.nodes()] == [
        ("n-new", "http://127.0.0.1:3", False, None),
        ("n-old", "http://127.0.0.1:2", True, where),
    ]
