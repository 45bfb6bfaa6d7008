"""The database side of retention (``polar_cli.server.retention``): acknowledgements, the tasks retention may act on,
and compacting or removing one, each a transaction of ``SQLiteStore`` (this is its mixin).

A task's row records when it was acknowledged (``acked_at``) and what retention did to it (``retained``:
``compacted`` or ``removed``, at ``retained_at``). A removed task keeps its row (state, times) and its sessions'
rows (their states, no result): the server still knows it, answers 410 for it, and a late duplicate report from a
gateway is still recognised as one.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from polar_cli.errors import RemovedError, SessionError, TaskNotEndedError
from polar_cli.models import SessionResult
from polar_cli.rewards import COMPACTED_KEY, trainable_tokens
from polar_cli.server.retention import Candidate, Retained, RetentionMode

ENDED = "('completed', 'failed', 'cancelled')"
FREED_KEY = "retention_freed_bytes"
RETENTION_INDEXES = """
CREATE INDEX IF NOT EXISTS tasks_acked ON tasks(acked_at) WHERE acked_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_retained ON tasks(retained) WHERE retained IS NOT NULL;
"""
"""Created once the columns exist (a database made before them gets them when it opens)."""
RETENTION_COLUMNS = {"acked_at": "REAL", "retained": "TEXT", "retained_at": "REAL"}


@dataclass(frozen=True)
class Retired:
    """One task compacted or removed: its sessions (whose files go too) and the bytes its results shrank by."""

    task_id: str
    retained: Retained
    session_ids: list[str]
    freed_bytes: int


@dataclass(frozen=True)
class RetentionCounts:
    compacted_tasks: int = 0
    removed_tasks: int = 0
    freed_bytes: int = 0
    """What retention removed from the results in the database (files are counted by the caller)."""


def removed_error(task_id: str, retained_at: float | None) -> RemovedError:
    when = "" if retained_at is None else time.strftime(" at %Y-%m-%d %H:%M:%S UTC", time.gmtime(retained_at))
    return RemovedError(
        f"task {task_id!r} was removed by retention{when}: it had ended and been acknowledged, and its results are "
        "gone (the server's retention settings)"
    )


class _Transactions(Protocol):
    @property
    def _db(self) -> sqlite3.Connection: ...
    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...
    def _snapshot(self) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...


class RetentionQueries:
    """Acknowledgements and retention, on ``SQLiteStore``'s connections and transactions."""

    def ack_task(self: _Transactions, task_id: str) -> float:
        """Record that the trainer has what it needs of the ended task; when it was first acknowledged."""
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT state, acked_at FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if row is None:
                raise SessionError(f"unknown task {task_id!r}")
            if row["state"] not in ("completed", "failed", "cancelled"):
                raise TaskNotEndedError(
                    f"task {task_id!r} is {row['state']}: only a task that has ended can be acknowledged"
                )
            if row["acked_at"] is not None:
                return float(row["acked_at"])
            db.execute("UPDATE tasks SET acked_at = ? WHERE task_id = ?", (now, task_id))
        return now

    def retention_candidates(self: _Transactions, mode: RetentionMode) -> Iterator[Candidate]:
        """Acknowledged tasks retention may act on in ``mode``, the oldest acknowledgement first: ended, with no
        callback left to deliver, not removed (in mode compact: not compacted either)."""
        kept = "retained IS NULL" if mode == "compact" else "(retained IS NULL OR retained = 'compacted')"
        rows = self._db.execute(
            f"SELECT task_id, acked_at, retained FROM tasks AS t WHERE acked_at IS NOT NULL AND {kept} "
            f"AND state IN {ENDED} AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.task_id = t.task_id "
            "AND o.delivered_at IS NULL) ORDER BY acked_at, task_id"
        )
        for r in rows:
            yield Candidate(r["task_id"], float(r["acked_at"]), r["retained"])

    def task_data(self: _Transactions, task_id: str) -> tuple[int, list[str]]:
        """The bytes of the task's results and body in the database, and its session ids."""
        rows = self._db.execute(
            "SELECT session_id, COALESCE(LENGTH(CAST(result AS BLOB)), 0) AS n FROM sessions WHERE task_id = ?",
            (task_id,),
        ).fetchall()
        body = self._db.execute("SELECT LENGTH(CAST(body AS BLOB)) FROM tasks WHERE task_id = ?", (task_id,))
        return sum(r["n"] for r in rows) + (body.fetchone()[0] or 0), [r["session_id"] for r in rows]

    def retire(self: _Transactions, task_id: str, mode: RetentionMode, file_bytes: int = 0) -> Retired | None:
        """Compact or remove the task, checked again in this transaction (ended, acknowledged, every callback
        delivered, not done already); None when it no longer qualifies. ``file_bytes``: what its files hold (the
        caller removes them once this has committed), counted in the bytes freed."""
        now = time.time()
        with self._tx() as db:
            task = db.execute(
                f"SELECT retained FROM tasks AS t WHERE task_id = ? AND acked_at IS NOT NULL AND state IN {ENDED} "
                "AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.task_id = t.task_id AND o.delivered_at IS NULL)",
                (task_id,),
            ).fetchone()
            if task is None or task["retained"] == "removed" or (mode == "compact" and task["retained"] is not None):
                return None
            sessions = db.execute(
                "SELECT session_id, result FROM sessions WHERE task_id = ? ORDER BY sample_index", (task_id,)
            ).fetchall()
            before = sum(len(r["result"].encode()) for r in sessions if r["result"] is not None)
            after = 0
            if mode == "remove":
                body = db.execute("SELECT LENGTH(CAST(body AS BLOB)) FROM tasks WHERE task_id = ?", (task_id,))
                before += body.fetchone()[0] or 0
                db.execute("UPDATE sessions SET result = NULL WHERE task_id = ?", (task_id,))
                db.execute("DELETE FROM outbox WHERE task_id = ? AND delivered_at IS NOT NULL", (task_id,))
                db.execute(
                    "UPDATE tasks SET body = '', retained = 'removed', retained_at = ? WHERE task_id = ?",
                    (now, task_id),
                )
            else:
                for r in sessions:
                    if r["result"] is None:
                        continue
                    compacted = compact_result(SessionResult.model_validate_json(r["result"])).model_dump_json()
                    after += len(compacted.encode())
                    db.execute("UPDATE sessions SET result = ? WHERE session_id = ?", (compacted, r["session_id"]))
                db.execute("UPDATE tasks SET retained = 'compacted', retained_at = ? WHERE task_id = ?", (now, task_id))
            freed = max(0, before - after) + file_bytes
            db.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + ?",
                (FREED_KEY, str(freed), freed),
            )
        retained: Retained = "removed" if mode == "remove" else "compacted"
        return Retired(task_id, retained, [r["session_id"] for r in sessions], freed)

    def retention_counts(self: _Transactions) -> RetentionCounts:
        with self._snapshot() as db:
            counts = dict(
                db.execute(
                    "SELECT retained, COUNT(*) FROM tasks WHERE retained IS NOT NULL GROUP BY retained"
                ).fetchall()
            )
            freed = db.execute("SELECT value FROM meta WHERE key = ?", (FREED_KEY,)).fetchone()
        return RetentionCounts(
            compacted_tasks=counts.get("compacted", 0),
            removed_tasks=counts.get("removed", 0),
            freed_bytes=0 if freed is None else int(freed[0]),
        )

    def db_bytes(self: _Transactions) -> tuple[int, int, int]:
        """The bytes of the task bodies and results stored (a running count, ``polar_cli.server.counters``), and of
        the database's free pages (reused for new results before the file grows again) and pages in all."""
        with self._snapshot() as db:
            data = db.execute("SELECT n FROM counters WHERE kind = 'data' AND key = 'bytes'").fetchone()
            size = db.execute("PRAGMA page_size").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            pages = db.execute("PRAGMA page_count").fetchone()[0]
        return (0 if data is None else int(data[0])), free * size, pages * size


def compact_result(result: SessionResult) -> SessionResult:
    """The result without its traces (token ids, logprobs, messages): its status, reward, error and metadata stay, and
    ``metadata.polar_compacted`` says how many traces and trainable tokens it had (its statistics do not change)."""
    held = {"traces": len(result.trajectory.traces), "trainable_tokens": trainable_tokens(result)}
    return result.model_copy(update={"trajectory": result.trajectory.model_copy(update={"traces": []}),
                                     "metadata": {**result.metadata, COMPACTED_KEY: held}})  # fmt: skip
