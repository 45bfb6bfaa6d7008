"""The generation ledger: ``<out>/ledger.db`` (SQLite, WAL, synchronous=FULL), what makes ``polar generate``
resumable.

- ``tasks``: each dataset task as it was first run (a re-run submits the very same bodies, so the service answers
  them idempotently);
- ``attempts``: each (task, sample, attempt) with the service task that runs it, recorded *before* it is submitted,
  and its outcome once known;
- ``results``: exactly one final SessionResult per (task, sample) (primary key; the first one written wins);
- ``result_tokens``: beside each result (same transaction), the same SessionResult split in two for ``polar export``:
  ``slim``, its JSON without the traces' token fields, and ``tokens``, those fields as binary arrays (see
  ``pack_tokens``), so an export never parses per-token JSON. Results written before this table existed (or whose
  tokens do not fit the exported types) have no row here; export reads their full JSON instead.

Each change is one transaction, so a crash at any point loses nothing that was committed and duplicates nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from polar_cli.errors import ConfigError
from polar_cli.models import SessionResult, TaskRequest
from polar_cli.rewards import is_accepted, trainable_tokens

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
CREATE TABLE IF NOT EXISTS result_tokens (
    task_id TEXT NOT NULL, sample_index INTEGER NOT NULL, slim BLOB NOT NULL, tokens BLOB NOT NULL,
    PRIMARY KEY (task_id, sample_index)
);
"""
TOKEN_FIELDS = ("prompt_ids", "response_ids", "loss_mask", "response_logprobs")


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

    def __init__(self, out: Path, *, durable: bool = True) -> None:
        """``durable=False``: no fsync per commit (a temporary ledger, such as ``polar_cli.online``'s)."""
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LEDGER
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the run's identity -------------------------------------------------------------------------------------

    def check_recipe(self, recipe: dict[str, object]) -> None:
        """Remember what this folder generates; once an attempt has run, a later run whose ``recipe`` differs is an
        error naming the first key that does (``recipe`` holds only what every row depends on: more samples or more
        tasks extend a folder, see ``stored_task``). Before any attempt, nothing was generated: the new recipe
        replaces the old one, and the tasks remembered with it are forgotten."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'recipe'").fetchone()
        started = self.db.execute("SELECT 1 FROM attempts LIMIT 1").fetchone() is not None
        if row is None or not started:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("DELETE FROM tasks")
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('recipe', ?)", (orjson.dumps(recipe).decode(),))
            return
        saved = orjson.loads(row[0])
        for key in sorted(recipe):  # a recipe saved by an older Polar has more keys: only these pin the rows
            if saved.get(key) != recipe.get(key):
                raise ConfigError(
                    f"{self.path.parent} was generated with {key}={saved.get(key)!r}, not {recipe.get(key)!r}: its "
                    "rows would not match the new ones. Re-run with the same setting to resume or extend it (more "
                    "--samples and more tasks are fine), or use another --out"
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

    def reorder(self, task_ids: Iterable[str]) -> None:
        """Put the tasks in this order (the dataset order), in one transaction; tasks not named keep theirs."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany("UPDATE tasks SET position = ? WHERE task_id = ?",
                                [(n, t) for n, t in enumerate(task_ids)])  # fmt: skip

    def stored_task(self, task_id: str) -> TaskRequest | None:
        """The task as first recorded, None when it is new."""
        row = self.db.execute("SELECT request FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else TaskRequest.model_validate_json(row[0])

    def more_samples(self, task_id: str, num_samples: int) -> None:
        """Raise a recorded task's ``num_samples`` (its other fields stay as first recorded)."""
        task = self.task(task_id).model_copy(update={"num_samples": num_samples})
        self.db.execute("UPDATE tasks SET request = ? WHERE task_id = ?", (task.model_dump_json(), task_id))

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

    def harnesses(self) -> dict[str, str]:
        """Each task's ``agent.harness``."""
        query = "SELECT task_id, json_extract(request, '$.agent.harness') FROM tasks"
        return {t: "-" if v is None else str(v) for t, v in self.db.execute(query)}

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
            if cursor.rowcount == 1 and (columnar := split_result(result)) is not None:
                self.db.execute("INSERT OR IGNORE INTO result_tokens VALUES (?, ?, ?, ?)",
                                (row.task_id, row.sample_index, *columnar))  # fmt: skip
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

    def export_results(self, rows: Iterable[ResultRow]) -> Iterator[ExportedResult]:
        """``rows``' results, streamed in their order (one in memory at a time): ``(row, json, None)`` with the full
        SessionResult JSON, or, where ``result_tokens`` has it, ``(row, slim json, each trace's tokens)``. One lookup
        by primary key each: sorting the blobs with the keys (one query, ORDER BY) would copy them all to a
        temporary B-tree before the first came back."""
        columnar = "SELECT slim, tokens FROM result_tokens WHERE task_id = ? AND sample_index = ?"
        full = "SELECT result FROM results WHERE task_id = ? AND sample_index = ?"
        for row in rows:
            key = (row.task_id, row.sample_index)
            found = self.db.execute(columnar, key).fetchone()
            if found is not None:
                yield row, bytes(found[0]), unpack_tokens(found[1])
            else:
                yield row, bytes(self.db.execute(full, key).fetchone()[0]), None


@dataclass(frozen=True)
class TraceTokens:
    """One trace's token fields as the exported types: int32 ids, int8 mask, float64 logprobs (None: no logprobs)."""

    prompt_ids: np.ndarray[Any, Any]
    response_ids: np.ndarray[Any, Any]
    loss_mask: np.ndarray[Any, Any]
    response_logprobs: np.ndarray[Any, Any] | None


ExportedResult = tuple[ResultRow, bytes, list[TraceTokens] | None]
"""A result as export reads it: its row, then its full JSON and None, or its slim JSON and its traces' tokens."""


def split_result(result: SessionResult) -> tuple[bytes, bytes] | None:
    """``result`` as (its JSON without the traces' token fields, ``pack_tokens`` of those fields); None when a
    token value does not fit the exported type exactly (export then reads the full JSON, as it always could)."""
    traces = []
    for trace in result.trajectory.traces:
        prompt, response = np.array(trace.prompt_ids, dtype=np.int64), np.array(trace.response_ids, dtype=np.int64)
        if any(a.size and (a.min() < -(2**31) or a.max() >= 2**31) for a in (prompt, response)):
            return None
        logprobs = trace.response_logprobs
        traces.append(TraceTokens(
            prompt.astype(np.int32), response.astype(np.int32),
            np.array(trace.loss_mask, dtype=np.int8),
            None if logprobs is None else np.array([e["logprob"] for e in logprobs], dtype=np.float64),
        ))  # fmt: skip
    exclude = {"trajectory": {"traces": {"__all__": set(TOKEN_FIELDS)}}}
    return result.model_dump_json(exclude=exclude).encode(), pack_tokens(traces)


def pack_tokens(traces: list[TraceTokens]) -> bytes:
    """int64 header ``[n, then per trace: prompt, response, has logprobs]``, then every trace's float64 logprobs,
    int32 prompt and response ids, int8 masks (each section 8-byte aligned after the one before)."""
    header = [len(traces)]
    for t in traces:
        header += [len(t.prompt_ids), len(t.response_ids), int(t.response_logprobs is not None)]
    parts = [np.array(header, dtype=np.int64).tobytes()]
    parts += [t.response_logprobs.tobytes() for t in traces if t.response_logprobs is not None]
    parts += [a.tobytes() for t in traces for a in (t.prompt_ids, t.response_ids)]
    parts += [t.loss_mask.tobytes() for t in traces]
    return b"".join(parts)


def unpack_tokens(blob: bytes) -> list[TraceTokens]:
    """``pack_tokens``'s traces, as read-only views of ``blob`` (no copy)."""
    n = int(np.frombuffer(blob, dtype=np.int64, count=1)[0])
    header = np.frombuffer(blob, dtype=np.int64, count=1 + 3 * n, offset=0)[1:].reshape(n, 3).tolist()
    offset = 8 * (1 + 3 * n)
    logprobs: list[np.ndarray[Any, Any] | None] = []
    for _, response, has in header:
        logprobs.append(np.frombuffer(blob, dtype=np.float64, count=response, offset=offset) if has else None)
        offset += 8 * response if has else 0
    ids = []
    for prompt, response, _ in header:
        ids.append((np.frombuffer(blob, dtype=np.int32, count=prompt, offset=offset),
                    np.frombuffer(blob, dtype=np.int32, count=response, offset=offset + 4 * prompt)))  # fmt: skip
        offset += 4 * (prompt + response)
    traces = []
    for (_, response, _), (p, r), lp in zip(header, ids, logprobs, strict=True):
        traces.append(TraceTokens(p, r, np.frombuffer(blob, dtype=np.int8, count=response, offset=offset), lp))
        offset += response
    return traces


def summarize(task: TaskRequest, sample: int, group: str, attempt: int, result: SessionResult,
              accept_min_reward: float) -> ResultRow:  # fmt: skip
    """``result``'s summary row: ``accepted`` when it completed with a trainable token and at least that reward."""
    traces = result.trajectory.traces
    trainable = trainable_tokens(result)  # side traces (by default) train nothing
    accepted = is_accepted(result, accept_min_reward)
    return ResultRow(
        task_id=task.task_id, sample_index=sample, session_id=result.session_id, group=group, attempts=attempt,
        status=result.status, reward=result.reward, accepted=accepted, trainable_tokens=trainable,
        tokens=sum(len(t.prompt_ids) + len(t.response_ids) for t in traces), turns=result.num_completions,
        traces=len(traces),
    )  # fmt: skip


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
