"""The generation ledger: ``<out>/ledger.db`` (SQLite, WAL, synchronous=FULL), what makes ``polar generate``
resumable.

- ``tasks``: each dataset task as it was first run (a re-run submits the very same bodies, so the service answers
  them idempotently);
- ``attempts``: each (task, sample, attempt) with the service task that runs it, recorded *before* it is submitted,
  and its outcome once known;
- ``results``: exactly one final SessionResult per (task, sample) (primary key; the first one written wins).

Each change is one transaction, so a crash at any point loses nothing that was committed and duplicates nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from polar_cli.errors import ConfigError
from polar_cli.models import SessionResult, TaskRequest

LEDGER = "ledger.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, position INTEGER NOT NULL, grp TEXT NOT NULL, request BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    task_id TEXT NOT NULL, sample_index INTEGER NOT NULL, attempt INTEGER NOT NULL, service_task_id TEXT NOT NULL,
    status TEXT, error TEXT, PRIMARY KEY (task_id, sample_index, attempt)
);
CREATE TABLE IF NOT EXISTS results (
    task_id TEXT NOT NULL, sample_index INTEGER NOT NULL, session_id TEXT NOT NULL, grp TEXT NOT NULL,
    attempts INTEGER NOT NULL, status TEXT NOT NULL, reward REAL, accepted INTEGER NOT NULL,
    trainable_tokens INTEGER NOT NULL, tokens INTEGER NOT NULL, turns INTEGER NOT NULL, traces INTEGER NOT NULL,
    result BLOB NOT NULL, PRIMARY KEY (task_id, sample_index)
);
"""


@dataclass(frozen=True)
class ResultRow:
    """A final result's summary columns (everything but the SessionResult itself)."""

    task_id: str
    sample_index: int
    session_id: str
    group: str
    attempts: int
    status: str
    reward: float | None
    accepted: bool
    trainable_tokens: int
    tokens: int
    turns: int
    traces: int


@dataclass(frozen=True)
class Attempt:
    attempt: int
    service_task_id: str
    status: str | None
    """None while it runs (or ran when the process died)."""


SUMMARY = (
    "task_id, sample_index, session_id, grp, attempts, status, reward, accepted, trainable_tokens, tokens, turns, "
    "traces"
)


class Ledger:
    """One output folder's ledger. Not thread-safe: one event loop uses it."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LEDGER
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the run's identity -------------------------------------------------------------------------------------

    def check_recipe(self, recipe: dict[str, object]) -> None:
        """Remember what this folder generates; a later run with other settings is an error naming the first."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'recipe'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('recipe', ?)", (orjson.dumps(recipe).decode(),))
            return
        saved = orjson.loads(row[0])
        for key in sorted(set(saved) | set(recipe)):
            if saved.get(key) != recipe.get(key):
                raise ConfigError(
                    f"{self.path.parent} was generated with {key}={saved.get(key)!r}, not {recipe.get(key)!r}: "
                    "re-run with the same settings to resume, or use another --out"
                )

    # ---- tasks --------------------------------------------------------------------------------------------------

    def remember_task(self, position: int, group: str, task: TaskRequest) -> TaskRequest:
        """The task as first recorded (this one if it is new)."""
        row = self.db.execute("SELECT request FROM tasks WHERE task_id = ?", (task.task_id,)).fetchone()
        if row is not None:
            return TaskRequest.model_validate_json(row[0])
        self.db.execute(
            "INSERT INTO tasks VALUES (?, ?, ?, ?)", (task.task_id, position, group, task.model_dump_json())
        )
        return task

    def task(self, task_id: str) -> TaskRequest:
        row = self.db.execute("SELECT request FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise ConfigError(f"{self.path}: no task {task_id!r}")
        return TaskRequest.model_validate_json(row[0])

    def task_field(self, field: str) -> dict[str, str]:
        """Each task's metadata ``field`` (or its ``task_id``) as text, ``-`` where it has none."""
        if field == "task_id":
            return {t: t for (t,) in self.db.execute("SELECT task_id FROM tasks")}
        path = '$.metadata."' + field.replace('"', "") + '"'
        query = "SELECT task_id, json_extract(request, ?) FROM tasks"
        return {t: "-" if v is None else str(v) for t, v in self.db.execute(query, (path,))}

    def task_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0])

    # ---- attempts -----------------------------------------------------------------------------------------------

    def attempts(self, task_id: str, sample_index: int) -> list[Attempt]:
        rows = self.db.execute(
            "SELECT attempt, service_task_id, status FROM attempts WHERE task_id = ? AND sample_index = ? "
            "ORDER BY attempt",
            (task_id, sample_index),
        ).fetchall()
        return [Attempt(*row) for row in rows]

    def start_attempt(self, task_id: str, sample_index: int, attempt: int, service_task_id: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO attempts (task_id, sample_index, attempt, service_task_id) VALUES (?, ?, ?, ?)",
            (task_id, sample_index, attempt, service_task_id),
        )

    def end_attempt(self, task_id: str, sample_index: int, attempt: int, status: str, error: str | None) -> None:
        self.db.execute(
            "UPDATE attempts SET status = ?, error = ? WHERE task_id = ? AND sample_index = ? AND attempt = ?",
            (status, error, task_id, sample_index, attempt),
        )

    def ended_attempts(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM attempts WHERE status IS NOT NULL").fetchone()[0])

    # ---- results ------------------------------------------------------------------------------------------------

    def finish(self, row: ResultRow, result: SessionResult) -> bool:
        """Record the final result of (task, sample) with its attempt's outcome, in one transaction; False when one
        was already recorded (it is kept)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            cursor = self.db.execute(
                f"INSERT OR IGNORE INTO results ({SUMMARY}, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.task_id, row.sample_index, row.session_id, row.group, row.attempts, row.status, row.reward,
                 int(row.accepted), row.trainable_tokens, row.tokens, row.turns, row.traces,
                 result.model_dump_json().encode()),
            )  # fmt: skip
            self.db.execute(
                "UPDATE attempts SET status = ?, error = ? WHERE task_id = ? AND sample_index = ? AND attempt = ?",
                (result.status, result.error, row.task_id, row.sample_index, row.attempts),
            )
        return cursor.rowcount == 1

    def finished(self) -> set[tuple[str, int]]:
        return {(t, s) for t, s in self.db.execute("SELECT task_id, sample_index FROM results")}

    def rows(self) -> list[ResultRow]:
        """Every final result's summary, in dataset order (small: no SessionResult is read)."""
        query = f"SELECT {', '.join('r.' + c for c in SUMMARY.split(', '))} FROM results r "
        query += "JOIN tasks t USING (task_id) ORDER BY t.position, r.sample_index"
        return [_row(values) for values in self.db.execute(query)]

    def results(self) -> Iterator[tuple[ResultRow, bytes]]:
        """Every final result with its SessionResult JSON, streamed in dataset order (one row in memory at a time)."""
        query = f"SELECT {', '.join('r.' + c for c in SUMMARY.split(', '))}, r.result FROM results r "
        query += "JOIN tasks t USING (task_id) ORDER BY t.position, r.sample_index"
        cursor = self.db.execute(query)
        while batch := cursor.fetchmany(64):
            for values in batch:
                yield _row(values[:-1]), bytes(values[-1])


def _row(values: tuple[Any, ...]) -> ResultRow:
    task_id, sample, session, group, attempts, status, reward, accepted, trainable, tokens, turns, traces = values
    return ResultRow(
        str(task_id), int(sample), str(session), str(group), int(attempts), str(status),
        None if reward is None else float(reward), bool(accepted), int(trainable), int(tokens), int(turns), int(traces),
    )  # fmt: skip


def open_ledger(out: Path, *, must_exist: bool = False) -> Ledger:
    if must_exist and not (out / LEDGER).is_file():
        raise ConfigError(f"{out}: no {LEDGER} here (not a polar generate output folder)")
    return Ledger(out)
