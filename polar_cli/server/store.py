"""The rollout server's durable state behind a small interface, with a SQLite (WAL) implementation.

Tasks, their sessions (``pending → dispatched → running → finished``, or ``cancelled``; each dispatch an attempt,
and each attempt's node is kept), the nodes that registered, and the outbox of trainer callbacks. Every state change
is one transaction, so a crash at any point leaves a consistent database: :meth:`SessionStore.report` commits a
result (and its callbacks) before it returns, and a session finishes exactly once.

The methods block; the server calls them from its store threads (``polar_cli.server.store_threads``), never from its
event loop. Each thread gets its own connection (WAL: readers never wait for the writer).
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import orjson

from polar_cli.errors import SessionError, SessionExistsError
from polar_cli.models import (
    Placement,
    SessionResult,
    SessionState,
    TaskRequest,
    TaskState,
    TaskStatus,
    Trajectory,
    TrajectoryStatus,
)
from polar_cli.rewards import task_reward_stats
from polar_cli.server.counters import install_counters
from polar_cli.server.retention import Candidate, RetentionMode
from polar_cli.server.store_retention import (
    RETENTION_COLUMNS,
    RETENTION_INDEXES,
    RetentionCounts,
    RetentionQueries,
    Retired,
    removed_error,
)

UNFINISHED = ("pending", "dispatched", "running")
ASSIGNED = ("dispatched", "running")
CallbackKind = Literal["session_result", "task_status"]


def task_digest(task: TaskRequest) -> str:
    """A stable digest of a TaskRequest's content: the same body again is the same task."""
    return hashlib.sha256(orjson.dumps(task.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).hexdigest()


def failed_result(
    task_id: str, session_id: str, sample_index: int, status: TrajectoryStatus, error: str
) -> SessionResult:
    """The result of a session that never produced one itself (lost too often, cancelled before it ran, ...)."""
    return SessionResult(
        session_id=session_id,
        task_id=task_id,
        sample_index=sample_index,
        status=status,
        trajectory=Trajectory(status=status, session_id=session_id, error=error),
        error=error,
    )


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    task_id: str
    sample_index: int
    state: SessionState
    attempt: int
    node_id: str | None


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    url: str
    token: str
    run_slots: int
    draining: bool
    placement: Placement | None = None
    """Where the node runs (its host, its Slurm job and step), as it said when it last registered."""


@dataclass(frozen=True)
class Submitted:
    task_id: str
    state: TaskState
    created: bool


@dataclass(frozen=True)
class Finished:
    """What :meth:`SessionStore.finish` did: ``accepted`` the first time only; ``task_ended`` when it was the last."""

    accepted: bool
    task_ended: bool = False


Verdict = Literal["accepted", "requeued", "duplicate", "refused"]


@dataclass(frozen=True)
class Reported:
    """What :meth:`SessionStore.report` did with a node's result.

    ``accepted``: the session's one result (``task_ended`` when it was the last); ``requeued``: a ``cancelled``
    result of the latest attempt, so the session runs again (or, attempts used up, ``accepted`` as an error);
    ``duplicate``: that node did hold that attempt, but the session has ended or moved on: ignored; ``refused``:
    that attempt of the session was never sent to that node: nothing changed.
    """

    verdict: Verdict
    task_ended: bool = False


@dataclass(frozen=True)
class HeldCheck:
    """A heartbeat compared with the database: sessions the node should drop, sessions it should hold but does not."""

    cancel: list[str]
    missing: list[SessionRow]


@dataclass(frozen=True)
class Callback:
    """One outbox entry: a trainer callback still to deliver."""

    id: int
    key: str
    url: str
    kind: CallbackKind
    task_id: str
    session_id: str | None
    attempts: int


class SessionStore(Protocol):
    """What the server keeps. Writes come from one thread; reads may come from others at the same time."""

    def submit(self, task: TaskRequest, session_ids: list[str]) -> Submitted: ...
    def task(self, task_id: str) -> TaskRequest: ...
    def task_status(self, task_id: str, *, with_results: bool = True) -> TaskStatus: ...
    def task_state(self, task_id: str) -> TaskState: ...
    def task_counts(self) -> dict[TaskState, int]: ...
    def last_ended_tasks(self, limit: int) -> list[str]: ...
    def ended_tasks(self, since: float) -> list[str]: ...
    def session(self, session_id: str) -> SessionRow: ...
    def sessions(
        self, *, states: tuple[str, ...], node_id: str | None = None, limit: int | None = None
    ) -> list[SessionRow]: ...
    def count_sessions(self, state: SessionState) -> int: ...
    def session_counts(self) -> dict[SessionState, int]: ...
    def finished_since(self, times: list[float]) -> list[int]: ...
    def assigned_counts(self) -> dict[str, int]: ...
    def dispatch(self, session_id: str, node_id: str) -> int | None: ...
    def dispatch_many(self, assignments: list[tuple[str, str]]) -> list[int | None]: ...
    def undo_dispatch(self, session_id: str, attempt: int) -> None: ...
    def undo_dispatch_many(self, dispatches: list[tuple[str, int]]) -> None: ...
    def mark_running(self, node_id: str, session_ids: list[str]) -> None: ...
    def check_held(self, node_id: str, held: list[str], sent_before: float | None = None) -> HeldCheck: ...
    def finish(self, session_id: str, result: SessionResult) -> Finished: ...
    def report(
        self, session_id: str, node_id: str, attempt: int, result: SessionResult, max_attempts: int
    ) -> Reported: ...
    def requeue(self, session_id: str, attempt: int, reason: str, max_attempts: int) -> Finished | None: ...
    def cancel_task(self, task_id: str) -> list[SessionRow]: ...
    def result(self, session_id: str) -> SessionResult | None: ...
    def upsert_node(
        self, node_id: str, url: str, token: str, run_slots: int, placement: Placement | None = None
    ) -> None: ...
    def node(self, node_id: str) -> NodeRow | None: ...
    def nodes(self) -> list[NodeRow]: ...
    def set_draining(self, node_id: str) -> None: ...
    def due_callbacks(self, now: float, limit: int = 64) -> list[Callback]: ...
    def callback_delivered(self, callback_id: int) -> None: ...
    def callback_failed(self, callback_id: int, next_at: float, error: str) -> None: ...
    def pending_callbacks(self) -> int: ...
    def next_callback_at(self) -> float | None: ...
    def meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def ack_task(self, task_id: str) -> float: ...
    def retention_candidates(self, mode: RetentionMode) -> Iterator[Candidate]: ...
    def task_data(self, task_id: str) -> tuple[int, list[str]]: ...
    def retire(self, task_id: str, mode: RetentionMode, file_bytes: int = 0) -> Retired | None: ...
    def retention_counts(self) -> RetentionCounts: ...
    def db_bytes(self) -> tuple[int, int, int]: ...
    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, body TEXT NOT NULL, digest TEXT NOT NULL, num_samples INTEGER NOT NULL,
    callback_url TEXT, state TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_updated ON tasks(updated_at);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, task_id TEXT NOT NULL REFERENCES tasks(task_id), sample_index INTEGER NOT NULL,
    state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, node_id TEXT, result TEXT, updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_task ON sessions(task_id, sample_index);
CREATE INDEX IF NOT EXISTS sessions_state ON sessions(state, node_id);
CREATE INDEX IF NOT EXISTS sessions_finished ON sessions(state, updated_at);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, url TEXT NOT NULL, token TEXT NOT NULL, run_slots INTEGER NOT NULL,
    draining INTEGER NOT NULL DEFAULT 0, registered_at REAL NOT NULL, placement TEXT);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE NOT NULL, url TEXT NOT NULL, kind TEXT NOT NULL,
    task_id TEXT NOT NULL, session_id TEXT, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
    delivered_at REAL, last_error TEXT);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(delivered_at, next_at);
CREATE INDEX IF NOT EXISTS outbox_task ON outbox(task_id, kind, delivered_at);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    session_id TEXT NOT NULL, attempt INTEGER NOT NULL, node_id TEXT NOT NULL, dispatched_at REAL NOT NULL,
    PRIMARY KEY (session_id, attempt));
CREATE INDEX IF NOT EXISTS sessions_by_state ON sessions(state);
"""
"""``sessions_by_state`` keeps each state's sessions in rowid order: the oldest ``pending`` ones are read without
sorting every pending session."""


_ADDED_COLUMNS = {"nodes": {"placement": "TEXT"}, "tasks": RETENTION_COLUMNS}
"""Columns added to a table after it was first released: a database made before gets them when it opens (``CREATE
TABLE IF NOT EXISTS`` leaves an existing table as it was)."""


def _add_columns(db: sqlite3.Connection) -> None:
    for table, columns in _ADDED_COLUMNS.items():
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns.items():
            if name not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


_NOT_WAITING = (
    "NOT (o.kind = 'task_status' AND EXISTS (SELECT 1 FROM outbox AS s WHERE s.task_id = o.task_id "
    "AND s.kind = 'session_result' AND s.delivered_at IS NULL))"
)
"""An outbox entry (``o``) that is not a task's status still waiting for one of the task's session results."""


class SQLiteStore(RetentionQueries):
    """:class:`SessionStore` in one SQLite file (WAL, ``synchronous=FULL``: a commit survives a power cut)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._db.executescript(_SCHEMA)
        with self._tx() as db:
            _add_columns(db)
            install_counters(db)
        self._db.executescript(RETENTION_INDEXES)

    @property
    def _db(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=10000")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several queries see one state (inside a transaction already: that one)."""
        db = self._db
        if db.in_transaction:
            yield db
            return
        db.execute("BEGIN")
        try:
            yield db
        finally:
            db.execute("COMMIT")

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; inside a transaction already (a group commit), a savepoint of it instead: an
        error then undoes this call's changes only, and the commit is the outer transaction's."""
        db = self._db
        if db.in_transaction:
            with self.savepoint():
                yield db
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Group commit: the write calls made inside run in ONE transaction (one fsync), committed on a clean exit,
        rolled back when the block raises. Each call should run in its own :meth:`savepoint`."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """A savepoint of the current transaction: released on a clean exit; rolled back to (this block's changes
        undone, the transaction kept) when the block raises."""
        db = self._db
        db.execute("SAVEPOINT polar_call")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK TO polar_call")
            db.execute("RELEASE polar_call")
            raise
        db.execute("RELEASE polar_call")

    # ---- tasks --------------------------------------------------------------------------------------------------

    def submit(self, task: TaskRequest, session_ids: list[str]) -> Submitted:
        digest = task_digest(task)
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT digest, state, retained, retained_at FROM tasks WHERE task_id = ?", (task.task_id,)
            ).fetchone()
            if row is not None and row["retained"] == "removed":
                raise removed_error(task.task_id, row["retained_at"])
            if row is not None:
                if row["digest"] != digest:
                    raise SessionExistsError(
                        f"task {task.task_id!r} exists with a different body: submit this one under another task_id "
                        "(polar submit --task-id ID), or without one to get a fresh id"
                    )
                return Submitted(task.task_id, row["state"], created=False)
            body = orjson.dumps(task.model_dump(mode="json")).decode()
            db.execute(
                "INSERT INTO tasks (task_id, body, digest, num_samples, callback_url, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
                (task.task_id, body, digest, task.num_samples, task.callback_url, now, now),
            )
            db.executemany(
                "INSERT INTO sessions (session_id, task_id, sample_index, state, updated_at) "
                "VALUES (?, ?, ?, 'pending', ?)",
                [(sid, task.task_id, i, now) for i, sid in enumerate(session_ids)],
            )
        return Submitted(task.task_id, "pending", created=True)

    def task(self, task_id: str) -> TaskRequest:
        row = self._db.execute("SELECT body, retained, retained_at FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise SessionError(f"unknown task {task_id!r}")
        if row["retained"] == "removed":
            raise removed_error(task_id, row["retained_at"])
        return TaskRequest.model_validate_json(row["body"])

    def task_state(self, task_id: str) -> TaskState:
        row = self._db.execute("SELECT state FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise SessionError(f"unknown task {task_id!r}")
        state: TaskState = row["state"]
        return state

    def task_status(self, task_id: str, *, with_results: bool = True) -> TaskStatus:
        with self._snapshot() as db:
            task = db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if task is None:
                raise SessionError(f"unknown task {task_id!r}")
            if task["retained"] == "removed":
                raise removed_error(task_id, task["retained_at"])
            columns = "session_id, state, result" if with_results else "session_id, state, NULL AS result"
            rows = db.execute(
                f"SELECT {columns} FROM sessions WHERE task_id = ? ORDER BY sample_index", (task_id,)
            ).fetchall()
            counts = self._status_counts(task_id)
        completed = counts.get("completed", 0)
        failed = sum(counts.values()) - completed
        results = [SessionResult.model_validate_json(r["result"]) for r in rows if r["result"] is not None]
        error = None
        if task["state"] == "failed" and set(counts) == {"no_model_call"}:
            error = (
                f"not one of its {failed} sessions made a model call through Polar's proxy (status no_model_call): "
                "the harness bypassed the base URL it was given or failed before its first call; see each "
                "session's error and harness_stderr"
            )
        return TaskStatus(
            task_id=task_id,
            state=task["state"],
            num_samples=task["num_samples"],
            sessions={r["session_id"]: r["state"] for r in rows},
            completed=completed,
            failed=failed,
            results=results,
            created_at=task["created_at"],
            updated_at=task["updated_at"],
            error=error,
            harness=orjson.loads(task["body"]).get("agent", {}).get("harness"),
            rewards=task_reward_stats(results) if with_results else None,
            acked_at=task["acked_at"],
            retention=task["retained"],
        )

    def _status_counts(self, task_id: str) -> dict[str, int]:
        """How many of the task's finished sessions ended with each status."""
        rows = self._db.execute(
            "SELECT json_extract(result, '$.status') AS status, COUNT(*) AS n FROM sessions "
            "WHERE task_id = ? AND state = 'finished' GROUP BY status",
            (task_id,),
        ).fetchall()
        return {r["status"]: r["n"] for r in rows}

    def _outcomes(self, task_id: str) -> tuple[int, int]:
        counts = self._status_counts(task_id)
        completed = counts.pop("completed", 0)
        return completed, sum(counts.values())

    def task_counts(self) -> dict[TaskState, int]:
        return {cast(TaskState, state): n for state, n in self._counted("task").items()}

    def last_ended_tasks(self, limit: int) -> list[str]:
        """The ``limit`` tasks that ended last (completed, failed or cancelled), the newest first."""
        rows = self._db.execute(
            "SELECT task_id FROM tasks WHERE state IN ('completed', 'failed', 'cancelled') "
            "AND retained IS NOT 'removed' ORDER BY updated_at DESC, task_id LIMIT ?",
            (limit,),
        ).fetchall()
        return [r["task_id"] for r in rows]

    def ended_tasks(self, since: float) -> list[str]:
        """The tasks that ended at or after ``since`` (an ended task's ``updated_at``: when it ended), oldest first;
        those retention removed left out."""
        rows = self._db.execute(
            "SELECT task_id FROM tasks WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at >= ? "
            "AND retained IS NOT 'removed' ORDER BY created_at, task_id",
            (since,),
        )
        return [r[0] for r in rows]

    def _refresh_task(self, db: sqlite3.Connection, task_id: str, now: float) -> bool:
        """Recompute the task's state; True when this change ended it (and queue its final callback)."""
        task = db.execute("SELECT state, callback_url FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if task["state"] in ("completed", "failed", "cancelled"):
            return False
        states = {
            r["state"]: r["n"]
            for r in db.execute("SELECT state, n FROM task_counters WHERE task_id = ? AND n > 0", (task_id,))
        }
        state: TaskState
        if not any(states.get(s) for s in UNFINISHED):
            completed, _ = self._outcomes(task_id)
            state = "completed" if completed else "failed"
        elif any(states.get(s) for s in ("dispatched", "running", "finished")):
            state = "running"
        else:
            state = "pending"
        db.execute("UPDATE tasks SET state = ?, updated_at = ? WHERE task_id = ?", (state, now, task_id))
        ended = state in ("completed", "failed")
        if ended:
            self._queue_callback(db, task["callback_url"], "task_status", task_id, None, now)
        return ended

    @staticmethod
    def _queue_callback(
        db: sqlite3.Connection, url: str | None, kind: CallbackKind, task_id: str, session_id: str | None, now: float
    ) -> None:
        if not url:
            return
        key = f"session_result:{session_id}" if kind == "session_result" else f"task_status:{task_id}"
        db.execute(
            "INSERT OR IGNORE INTO outbox (key, url, kind, task_id, session_id, next_at) VALUES (?, ?, ?, ?, ?, ?)",
            (key, url, kind, task_id, session_id, now),
        )

    # ---- sessions -----------------------------------------------------------------------------------------------

    @staticmethod
    def _row(r: sqlite3.Row) -> SessionRow:
        return SessionRow(r["session_id"], r["task_id"], r["sample_index"], r["state"], r["attempt"], r["node_id"])

    def session(self, session_id: str) -> SessionRow:
        r = self._db.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if r is None:
            raise SessionError(f"unknown session {session_id!r}")
        return self._row(r)

    def sessions(
        self, *, states: tuple[str, ...], node_id: str | None = None, limit: int | None = None
    ) -> list[SessionRow]:
        sql = f"SELECT * FROM sessions WHERE state IN ({','.join('?' * len(states))})"
        args: list[Any] = list(states)
        if node_id is not None:
            sql += " AND node_id = ?"
            args.append(node_id)
        sql += " ORDER BY rowid"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [self._row(r) for r in self._db.execute(sql, args)]

    def _counted(self, kind: str) -> dict[str, int]:
        """The running counters of ``kind`` (see ``_COUNTERS``), the keys counted at zero left out."""
        rows = self._db.execute("SELECT key, n FROM counters WHERE kind = ? AND n > 0", (kind,)).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def count_sessions(self, state: SessionState) -> int:
        r = self._db.execute("SELECT n FROM counters WHERE kind = 'session' AND key = ?", (state,)).fetchone()
        return 0 if r is None else int(r[0])

    def session_counts(self) -> dict[SessionState, int]:
        return {cast(SessionState, state): n for state, n in self._counted("session").items()}

    def finished_since(self, times: list[float]) -> list[int]:
        """How many sessions finished at or after each of ``times`` (a finished session's ``updated_at`` is when its
        result was committed: it never changes again)."""
        if not times:
            return []
        counts = ", ".join("COALESCE(SUM(updated_at >= ?), 0)" for _ in times)
        sql = f"SELECT {counts} FROM sessions WHERE state = 'finished' AND updated_at >= ?"
        return [int(n) for n in self._db.execute(sql, [*times, min(times)]).fetchone()]

    def assigned_counts(self) -> dict[str, int]:
        """Each node's sessions dispatched or running there (nodes with none left out)."""
        return self._counted("node")

    def dispatch(self, session_id: str, node_id: str) -> int | None:
        """pending → dispatched to ``node_id`` as a new attempt; its number, or None if it was not pending."""
        return self.dispatch_many([(session_id, node_id)])[0]

    def dispatch_many(self, assignments: list[tuple[str, str]]) -> list[int | None]:
        """:meth:`dispatch` for many ``(session_id, node_id)`` pairs in one transaction."""
        now = time.time()
        attempts: list[int | None] = []
        tasks: set[str] = set()
        with self._tx() as db:
            for session_id, node_id in assignments:
                row = db.execute(
                    "UPDATE sessions SET state = 'dispatched', attempt = attempt + 1, node_id = ?, updated_at = ? "
                    "WHERE session_id = ? AND state = 'pending' RETURNING task_id, attempt",
                    (node_id, now, session_id),
                ).fetchone()
                attempts.append(None if row is None else int(row["attempt"]))
                if row is not None:
                    tasks.add(row["task_id"])
                    db.execute(
                        "INSERT OR REPLACE INTO attempts VALUES (?, ?, ?, ?)",
                        (session_id, row["attempt"], node_id, now),
                    )
            for task_id in tasks:
                self._refresh_task(db, task_id, now)
        return attempts

    def undo_dispatch(self, session_id: str, attempt: int) -> None:
        """A dispatch that never reached its gateway: back to pending, the attempt not counted."""
        self.undo_dispatch_many([(session_id, attempt)])

    def undo_dispatch_many(self, dispatches: list[tuple[str, int]]) -> None:
        """:meth:`undo_dispatch` for many ``(session_id, attempt)`` pairs in one transaction."""
        now = time.time()
        with self._tx() as db:
            for session_id, attempt in dispatches:
                undone = db.execute(
                    "UPDATE sessions SET state = 'pending', attempt = attempt - 1, node_id = NULL, updated_at = ? "
                    "WHERE session_id = ? AND state = 'dispatched' AND attempt = ?",
                    (now, session_id, attempt),
                ).rowcount
                if undone:
                    db.execute("DELETE FROM attempts WHERE session_id = ? AND attempt = ?", (session_id, attempt))

    def mark_running(self, node_id: str, session_ids: list[str]) -> None:
        if not session_ids:
            return
        listed = orjson.dumps(session_ids).decode()  # one parameter however many: no SQLite variable limit
        with self._tx() as db:
            db.execute(
                "UPDATE sessions SET state = 'running', updated_at = ? WHERE state = 'dispatched' "
                "AND node_id = ? AND session_id IN (SELECT value FROM json_each(?))",
                (time.time(), node_id, listed),
            )

    def check_held(self, node_id: str, held: list[str], sent_before: float | None = None) -> HeldCheck:
        """A heartbeat's ``held`` sessions against the database: ``cancel`` lists the ones the node should not run
        (unknown, ended, or given to another node); ``missing`` the ones assigned to the node that it does not hold,
        of those dispatched (their latest attempt) before ``sent_before`` when given: one sent since may have
        reached the node after it wrote its heartbeat."""
        before = float("inf") if sent_before is None else sent_before
        with self._snapshot() as db:  # the node's sessions (indexed), compared in memory: O(what the node holds)
            assigned = {
                r[0]
                for r in db.execute(
                    "SELECT session_id FROM sessions WHERE state IN ('dispatched', 'running') AND node_id = ?",
                    (node_id,),
                )
            }
            cancel = [session_id for session_id in held if session_id not in assigned]
            absent = assigned.difference(held)
            missing = [
                self._row(r)
                for r in db.execute(
                    "SELECT s.* FROM json_each(?) AS h JOIN sessions AS s ON s.session_id = h.value LEFT JOIN attempts "
                    "AS a ON a.session_id = s.session_id AND a.attempt = s.attempt "
                    "WHERE COALESCE(a.dispatched_at, 0) < ? ORDER BY s.rowid",
                    (orjson.dumps(sorted(absent)).decode(), before),
                )
            ] if absent else []  # fmt: skip
        return HeldCheck(cancel, missing)

    def finish(self, session_id: str, result: SessionResult) -> Finished:
        """Commit ``result`` as the session's one result; ``accepted=False`` if it had finished (or was cancelled)."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionError(f"unknown session {session_id!r}")
            return self._finish(db, row, result)

    def _finish(self, db: sqlite3.Connection, row: sqlite3.Row, result: SessionResult) -> Finished:
        if row["state"] not in UNFINISHED:
            return Finished(accepted=False)
        now = time.time()
        session_id, task_id = row["session_id"], row["task_id"]
        db.execute(
            "UPDATE sessions SET state = 'finished', result = ?, updated_at = ? WHERE session_id = ?",
            (result.model_dump_json(), now, session_id),
        )
        url = db.execute("SELECT callback_url FROM tasks WHERE task_id = ?", (task_id,)).fetchone()[0]
        self._queue_callback(db, url, "session_result", task_id, session_id, now)
        return Finished(accepted=True, task_ended=self._refresh_task(db, task_id, now))

    def report(self, session_id: str, node_id: str, attempt: int, result: SessionResult, max_attempts: int) -> Reported:
        """``node_id``'s result for ``attempt`` of the session, judged and applied in one transaction (see
        :class:`Reported`). Only the latest attempt counts: an older one's result is a duplicate."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionError(f"unknown session {session_id!r}")
            held = db.execute(
                "SELECT node_id FROM attempts WHERE session_id = ? AND attempt = ?", (session_id, attempt)
            ).fetchone()
            holder = held[0] if held is not None else row["node_id"] if attempt == row["attempt"] else None
            if holder != node_id:
                return Reported("refused")
            if row["state"] not in UNFINISHED or row["attempt"] != attempt:
                return Reported("duplicate")
            if result.status == "cancelled":  # the node gave up on it (shutting down, told to): not the end
                if row["state"] not in ASSIGNED:
                    return Reported("duplicate")  # already pending again
                reason = f"node {node_id} cancelled it: {result.error or 'no reason given'}"
                requeued = self._requeue(db, row, reason, max_attempts)
                if requeued is not None and requeued.accepted:
                    return Reported("accepted", requeued.task_ended)
                return Reported("requeued")
            finished = self._finish(db, row, result)
            return Reported("accepted", finished.task_ended)

    def requeue(self, session_id: str, attempt: int, reason: str, max_attempts: int) -> Finished | None:
        """Attempt ``attempt`` was lost: pending again, or (attempts used up) finished with status error.

        None when the session had moved on (finished, or another attempt runs)."""
        with self._tx() as db:
            r = db.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if r is None or r["attempt"] != attempt:
                return None
            return self._requeue(db, r, reason, max_attempts)

    def _requeue(self, db: sqlite3.Connection, r: sqlite3.Row, reason: str, max_attempts: int) -> Finished | None:
        if r["state"] not in ASSIGNED:
            return None
        if r["attempt"] < max_attempts:
            db.execute(
                "UPDATE sessions SET state = 'pending', updated_at = ? WHERE session_id = ?",
                (time.time(), r["session_id"]),
            )
            return Finished(accepted=False)
        error = f"{reason} (attempt {r['attempt']} of {max_attempts}; no attempts left)"
        return self._finish(db, r, failed_result(r["task_id"], r["session_id"], r["sample_index"], "error", error))

    def cancel_task(self, task_id: str) -> list[SessionRow]:
        """Cancel every unfinished session of the task; the ones a gateway holds (to cancel there) are returned."""
        now = time.time()
        with self._tx() as db:
            task = db.execute("SELECT state, callback_url FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if task is None:
                raise SessionError(f"unknown task {task_id!r}")
            if task["state"] in ("completed", "failed", "cancelled"):
                return []
            held = [
                self._row(r)
                for r in db.execute(
                    "SELECT * FROM sessions WHERE task_id = ? AND state IN ('dispatched', 'running')", (task_id,)
                )
            ]
            for r in db.execute(
                "SELECT * FROM sessions WHERE task_id = ? AND state IN ('pending', 'dispatched', 'running')", (task_id,)
            ).fetchall():
                result = failed_result(
                    task_id, r["session_id"], r["sample_index"], "cancelled", "the task was cancelled"
                )
                db.execute(
                    "UPDATE sessions SET state = 'cancelled', result = ?, updated_at = ? WHERE session_id = ?",
                    (result.model_dump_json(), now, r["session_id"]),
                )
            db.execute("UPDATE tasks SET state = 'cancelled', updated_at = ? WHERE task_id = ?", (now, task_id))
            self._queue_callback(db, task["callback_url"], "task_status", task_id, None, now)
        return held

    def result(self, session_id: str) -> SessionResult | None:
        r = self._db.execute("SELECT result FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if r is None or r["result"] is None else SessionResult.model_validate_json(r["result"])

    # ---- nodes --------------------------------------------------------------------------------------------------

    def upsert_node(
        self, node_id: str, url: str, token: str, run_slots: int, placement: Placement | None = None
    ) -> None:
        where = None if placement is None else placement.model_dump_json()
        with self._tx() as db:
            db.execute(
                "INSERT INTO nodes (node_id, url, token, run_slots, draining, registered_at, placement) "
                "VALUES (?, ?, ?, ?, 0, ?, ?) ON CONFLICT(node_id) DO UPDATE SET url = excluded.url, token = "
                "excluded.token, run_slots = excluded.run_slots, registered_at = excluded.registered_at, "
                "placement = excluded.placement",
                (node_id, url, token, run_slots, time.time(), where),
            )

    @staticmethod
    def _node(r: sqlite3.Row) -> NodeRow:
        where = None if r["placement"] is None else Placement.model_validate_json(r["placement"])
        return NodeRow(r["node_id"], r["url"], r["token"], r["run_slots"], bool(r["draining"]), where)

    def node(self, node_id: str) -> NodeRow | None:
        r = self._db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return None if r is None else self._node(r)

    def nodes(self) -> list[NodeRow]:
        return [self._node(r) for r in self._db.execute("SELECT * FROM nodes ORDER BY node_id")]

    def set_draining(self, node_id: str) -> None:
        with self._tx() as db:
            if db.execute("UPDATE nodes SET draining = 1 WHERE node_id = ?", (node_id,)).rowcount != 1:
                raise SessionError(f"unknown node {node_id!r}")

    # ---- trainer callbacks (the outbox) -------------------------------------------------------------------------

    def due_callbacks(self, now: float, limit: int = 64) -> list[Callback]:
        """Undelivered entries whose time has come; a task's ``task_status`` only once every ``session_result`` of
        the task has been delivered (a task's callbacks end with its status)."""
        rows = self._db.execute(
            f"SELECT * FROM outbox AS o WHERE delivered_at IS NULL AND next_at <= ? AND {_NOT_WAITING} "
            "ORDER BY next_at, id LIMIT ?",
            (now, limit),
        )
        return [
            Callback(r["id"], r["key"], r["url"], r["kind"], r["task_id"], r["session_id"], r["attempts"]) for r in rows
        ]

    def callback_delivered(self, callback_id: int) -> None:
        """Delivered; a ``task_status`` (sent only once every result of its task was) acknowledges its task."""
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "UPDATE outbox SET delivered_at = ?, attempts = attempts + 1 WHERE id = ? RETURNING kind, task_id",
                (now, callback_id),
            ).fetchone()
            if row is not None and row["kind"] == "task_status":
                db.execute(
                    "UPDATE tasks SET acked_at = ? WHERE task_id = ? AND acked_at IS NULL", (now, row["task_id"])
                )

    def callback_failed(self, callback_id: int, next_at: float, error: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_at = ?, last_error = ? WHERE id = ?",
                (next_at, error[:500], callback_id),
            )

    def pending_callbacks(self) -> int:
        return self._counted("outbox").get("undelivered", 0)

    def next_callback_at(self) -> float | None:
        """When the next entry is due (a ``task_status`` waiting for its session results is not)."""
        r = self._db.execute(
            f"SELECT MIN(next_at) FROM outbox AS o WHERE delivered_at IS NULL AND {_NOT_WAITING}"
        ).fetchone()
        return None if r[0] is None else float(r[0])

    # ---- meta ---------------------------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        r = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else str(r[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value)
            )
