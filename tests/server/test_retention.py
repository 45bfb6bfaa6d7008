"""Retention's policy and its database side: parsing the settings, which acknowledged tasks are chosen (oldest first,
never one still running or not acknowledged), and what compacting or removing one leaves in the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_cli.errors import ConfigError, RemovedError, TaskNotEndedError
from polar_cli.models import SessionResult, Trace, Trajectory, validate_model
from polar_cli.server.retention import Candidate, RetentionConfig, select
from polar_cli.server.store import SQLiteStore
from tests.server.test_store import make_task


def test_settings_take_seconds_or_units_and_bad_values_name_the_field() -> None:
    config = RetentionConfig.model_validate({"max_age": "7d", "max_bytes": "50GB", "mode": "compact"})
    assert (config.max_age, config.max_bytes, config.mode) == (7 * 86400, 50 * 10**9, "compact")
    assert RetentionConfig.model_validate({"max_age": 90, "max_bytes": "2GiB"}).max_bytes == 2 * 1024**3
    assert RetentionConfig.model_validate({"max_age": "1.5h"}).max_age == 5400
    assert RetentionConfig().describe() == "keep everything" and not RetentionConfig().enabled
    assert config.describe() == "compact acknowledged tasks after 7d or over 50.0 GB"
    for field, value, said in [
        ("max_age", "7 days", "'7 days' is not a duration"),
        ("max_age", 0, "0 is not a duration: it must be more than 0 seconds"),
        ("max_bytes", "50 gigs", "'50 gigs' is not a size"),
        ("max_bytes", -5, "-5 is not a size: it must be at least 1 byte"),
        ("max_bytes", True, "True is not a size"),
        ("mode", "delete", "Input should be 'remove' or 'compact'"),
        ("max_days", 3, "unknown field"),
    ]:
        with pytest.raises(ConfigError) as caught:
            validate_model(RetentionConfig, {field: value}, source="serve.yaml")
        message = str(caught.value)
        assert message.startswith("serve.yaml: invalid RetentionConfig:") and field in message and said in message
        assert "\n" not in message


def _candidates(*acked: float) -> list[Candidate]:
    return [Candidate(f"t{i}", at, None) for i, at in enumerate(acked)]


def test_selection_takes_the_oldest_acknowledged_first_until_under_the_cap() -> None:
    sizes = {"t0": 100, "t1": 100, "t2": 100, "t3": 100}
    read: list[str] = []

    def size_of(candidate: Candidate) -> int:
        read.append(candidate.task_id)
        return sizes[candidate.task_id]

    cap = RetentionConfig(max_bytes=1000)
    chosen = select(_candidates(1, 2, 3, 4), cap, now=10, used_bytes=1150, size_of=size_of)
    assert [(s.task_id, s.reason, s.bytes) for s in chosen] == [("t0", "size", 100), ("t1", "size", 100)]
    assert read == ["t0", "t1"]  # the younger ones are not even sized
    assert select(_candidates(1, 2), cap, now=10, used_bytes=1000, size_of=size_of) == []  # at the cap: kept
    # not enough acknowledged data to get under the cap: all of it, and nothing else (the rest is not a candidate)
    assert [s.task_id for s in select(_candidates(1, 2), cap, now=10, used_bytes=5000, size_of=size_of)] == ["t0", "t1"]


def test_selection_by_age_then_by_size_and_what_each_mode_skips() -> None:
    def size_of(candidate: Candidate) -> int:
        return 100

    both = RetentionConfig(max_age=50, max_bytes=1000)
    chosen = select(_candidates(10, 40, 60, 70, 80), both, now=100, used_bytes=1150, size_of=size_of)
    # t0 and t1 are older than 50 s; then the size: 1150 - 200 is under the cap already
    assert [(s.task_id, s.reason) for s in chosen] == [("t0", "age"), ("t1", "age")]
    chosen = select(_candidates(10, 60, 70), both, now=100, used_bytes=1250, size_of=size_of)
    assert [(s.task_id, s.reason) for s in chosen] == [("t0", "age"), ("t1", "size"), ("t2", "size")]
    compacted = [Candidate("c", 1, "compacted"), Candidate("r", 2, "removed"), Candidate("n", 3, None)]
    age = {"max_age": 10}
    assert [s.task_id for s in select(compacted, RetentionConfig(**age, mode="compact"), now=100, used_bytes=0,
                                      size_of=size_of)] == ["n"]  # fmt: skip
    assert [s.task_id for s in select(compacted, RetentionConfig(**age), now=100, used_bytes=0,
                                      size_of=size_of)] == ["c", "n"]  # fmt: skip
    assert select(compacted, RetentionConfig(), now=100, used_bytes=10**12, size_of=size_of) == []  # keeps all


def _result(task_id: str, session_id: str, index: int) -> SessionResult:
    trace = Trace(prompt_ids=list(range(500)), response_ids=[1, 2, 3], loss_mask=[1, 1, 1], reward=1.0)
    trajectory = Trajectory(status="completed", session_id=session_id, traces=[trace])
    return SessionResult(session_id=session_id, task_id=task_id, sample_index=index, status="completed",
                         trajectory=trajectory, reward=1.0, num_completions=1)  # fmt: skip


def _ended(store: SQLiteStore, task_id: str, callback_url: str | None = None) -> list[str]:
    sessions = [f"{task_id}-{i}" for i in range(2)]
    store.submit(make_task(task_id, callback_url=callback_url), sessions)
    for i, session_id in enumerate(sessions):
        store.dispatch(session_id, "n1")
        store.finish(session_id, _result(task_id, session_id, i))
    return sessions


def _data_bytes(store: SQLiteStore) -> int:
    rows = store._db.execute(  # the tables themselves, against the running count
        "SELECT (SELECT SUM(LENGTH(CAST(body AS BLOB))) FROM tasks) + "
        "(SELECT COALESCE(SUM(LENGTH(CAST(result AS BLOB))), 0) FROM sessions)"
    )
    return int(rows.fetchone()[0])


def test_only_ended_acknowledged_tasks_with_every_callback_delivered_are_candidates(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    _ended(store, "acked")
    _ended(store, "not-acked")
    _ended(store, "callbacks", callback_url="http://127.0.0.1:9/cb")
    store.submit(make_task("running"), ["running-0", "running-1"])
    store.dispatch("running-0", "n1")
    with pytest.raises(TaskNotEndedError, match="'running' is running: only a task that has ended"):
        store.ack_task("running")
    first = store.ack_task("acked")
    assert store.ack_task("acked") == first  # the first acknowledgement counts
    store.ack_task("callbacks")  # acknowledged, but its callbacks are still to be delivered: not yet
    assert [c.task_id for c in store.retention_candidates("remove")] == ["acked"]
    for callback in store.due_callbacks(now=1e12):
        store.callback_delivered(callback.id)
    assert [c.key for c in store.due_callbacks(now=1e12)] == ["task_status:callbacks"]
    assert [c.task_id for c in store.retention_candidates("remove")] == ["acked"]  # its status is still to go
    store.callback_delivered(store.due_callbacks(now=1e12)[0].id)
    assert [c.task_id for c in store.retention_candidates("remove")] == ["acked", "callbacks"]
    _ended(store, "by-callback", callback_url="http://127.0.0.1:9/cb")  # never acknowledged by a call
    while due := store.due_callbacks(now=1e12):
        store.callback_delivered(due[0].id)
    assert store.task_status("by-callback").acked_at is not None  # its last callback delivered acknowledged it
    assert [c.task_id for c in store.retention_candidates("remove")] == ["acked", "callbacks", "by-callback"]
    assert store.retire("running", "remove") is None and store.retire("not-acked", "remove") is None


def test_compact_keeps_the_summaries_remove_leaves_a_410_and_the_byte_count_follows(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    sessions = _ended(store, "a")
    _ended(store, "b")
    assert store.db_bytes()[0] == _data_bytes(store) > 0
    store.ack_task("a")
    store.ack_task("b")
    before, full = store.db_bytes()[0], store.task_status("a")
    compacted = store.retire("a", "compact", file_bytes=7)
    assert compacted is not None and compacted.session_ids == sessions and compacted.retained == "compacted"
    status = store.task_status("a")
    assert status.retention == "compacted" and status.completed == 2 and status.rewards is not None
    assert [r.reward for r in status.results] == [1.0, 1.0] and all(not r.trajectory.traces for r in status.results)
    assert status.rewards == full.rewards and status.rewards.pass_at_k == {1: 1.0, 2: 1.0}  # accepted as before
    assert status.results[0].metadata["polar_compacted"] == {"traces": 1, "trainable_tokens": 3}
    assert store.db_bytes()[0] == _data_bytes(store) == before - (compacted.freed_bytes - 7)
    assert store.retire("a", "compact") is None  # done already
    assert [c.task_id for c in store.retention_candidates("compact")] == ["b"]
    removed = store.retire("a", "remove")
    assert removed is not None and removed.retained == "removed"
    assert store.db_bytes()[0] == _data_bytes(store)
    for read in (store.task_status, store.task):
        with pytest.raises(RemovedError, match=r"task 'a' was removed by retention at .* its results are gone"):
            read("a")
    assert RemovedError.http_status == 410
    with pytest.raises(RemovedError):
        store.submit(make_task("a"), ["x", "y"])
    assert store.ended_tasks(0) == ["b"] and store.last_ended_tasks(5) == ["b"]
    assert store.session(sessions[0]).state == "finished" and store.result(sessions[0]) is None
    counts = store.retention_counts()
    assert (counts.compacted_tasks, counts.removed_tasks) == (0, 1)
    assert counts.freed_bytes == compacted.freed_bytes + removed.freed_bytes
    store.close()
    reopened = SQLiteStore(tmp_path / "s.db")  # a restart: the same answers
    with pytest.raises(RemovedError):
        reopened.task_status("a")
    assert reopened.task_status("b").completed == 2 and reopened.db_bytes()[0] == _data_bytes(reopened)


def test_a_database_from_before_retention_opens_with_its_data_counted_and_its_tasks_kept(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    _ended(store, "old")
    expected = store.task_status("old")
    db = store._db  # back to the schema an older Polar left: no retention columns, triggers or byte count
    for trigger in ("results_sized", "bodies_sized", "bodies_resized"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute("DROP INDEX tasks_acked")
    db.execute("DROP INDEX tasks_retained")
    for column in ("acked_at", "retained", "retained_at"):
        db.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
    db.execute("DELETE FROM counters WHERE kind = 'data'")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'counters'")
    store.close()
    reopened = SQLiteStore(tmp_path / "s.db")
    assert reopened.task_status("old") == expected and list(reopened.retention_candidates("remove")) == []
    assert reopened.db_bytes()[0] == _data_bytes(reopened) > 0  # counted once, when it first opened
    reopened.ack_task("old")
    assert reopened.retire("old", "remove") is not None and reopened.db_bytes()[0] == _data_bytes(reopened)
