"""Online data as a ``polar generate`` folder: what ``polar serve`` ran, read by ``polar export``, ``polar view`` and
``polar verify`` through the very code that reads generate folders, so their outputs are the same by construction.

Three sources (told apart by :mod:`polar_cli.inputs`), each copied into a temporary ledger (a ``ledger.db`` in a
folder under ``$TMPDIR``, deleted afterwards, see :func:`online_ledger`), except for ``polar export`` of a data dir,
which reads it in place (:class:`StoreExport`, see :func:`export_source`):

* a ``polar serve`` data dir: its ``server.db`` opened read-only (SQLite WAL: a running server is neither blocked
  nor changed; each task is read in one snapshot);
* :class:`~polar_cli.inputs.ServerTasks`: tasks on a running server, over its HTTP API with its token (each task's
  TaskStatus, and the task as it was submitted);
* a ``polar status TASK --json`` file: its TaskStatus. It carries no task body, so the task is recovered from its
  results: the harness and builder from the traces' metadata, the task metadata from the results' (``model`` and
  the evaluator's SWE instance fields are then unknown).

Rows: a task is a group (GRPO's): its ``num_samples`` sessions; each row's ``group`` is its task id and its
``sample_index`` the session's index in the task (0 to num_samples - 1). Tasks come in the order they were submitted,
each task's sessions by sample index. Every session with a result is a row, with the status it ended with (completed,
error, timeout, cancelled, ...), as ``polar generate`` keeps them; sessions still pending or running are left out.
``attempts`` is the dispatch the result came from; ``accepted``: completed, with a trainable token and a reward of
at least :data:`~polar_cli.rewards.DEFAULT_MIN_REWARD` (``polar generate``'s default).
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from polar_cli.errors import ConfigError
from polar_cli.generate.ledger import ExportedResult, Ledger, ResultRow, summarize
from polar_cli.inputs import ONLINE_KINDS, ServerTasks, Source, input_kind, task_status_file
from polar_cli.models import AgentSpec, BuilderSpec, SessionResult, TaskRequest, TaskStatus
from polar_cli.node_protocol import ATTEMPT_KEY
from polar_cli.rewards import DEFAULT_MIN_REWARD
from polar_cli.server.config import DB_NAME

IDS = ("session_id", "task_id", "builder", "harness")
"""Keys a trace's metadata adds to its task's metadata."""
RESULT_KEYS = (ATTEMPT_KEY, "node_id", "run_status", "run", "evaluation")
"""Keys a SessionResult's metadata adds to its task's metadata (the gateway's, then the server's)."""
M = TypeVar("M", TaskRequest, SessionResult)


@dataclass(frozen=True)
class OnlineTask:
    """One task of an online source: the task as submitted, when it was, and its sessions' results."""

    request: TaskRequest
    created_at: float
    results: list[SessionResult]


def is_online(source: Source) -> bool:
    """Whether ``source`` is online data (read with :func:`online_ledger`)."""
    return isinstance(source, ServerTasks) or input_kind(source) in ONLINE_KINDS


@contextlib.contextmanager
def online_ledger(source: Source) -> Iterator[Ledger]:
    """``source`` (a serve data dir, a status file or tasks on a server) as a ledger, for the block's length."""
    with tempfile.TemporaryDirectory(prefix="polar-online-") as folder, Ledger(Path(folder), durable=False) as ledger:
        fill_ledger(ledger, online_tasks(source))
        yield ledger


def online_tasks(source: Source) -> Iterator[OnlineTask]:
    if isinstance(source, ServerTasks):
        return server_tasks(source)
    kind = input_kind(source)
    if kind == "serve":
        return store_tasks(source)
    if kind == "status":
        return iter([status_task(task_status_file(source))])
    raise ConfigError(f"{source} is not online data (a polar serve data dir or a polar status TASK --json file)")


def fill_ledger(ledger: Ledger, tasks: Iterable[OnlineTask]) -> None:
    """Record each task and its results in ``ledger`` (one task's results in memory at a time), tasks in the order
    they were submitted."""
    order: dict[str, float] = {}
    for task in tasks:
        if task.request.task_id in order:
            continue
        order[task.request.task_id] = task.created_at
        request = ledger.remember_task(len(order), task.request.task_id, task.request)
        for row, result in result_rows(request, task.results):
            ledger.finish(row, result)
    ledger.reorder(task_id for _, task_id in sorted((created, task_id) for task_id, created in order.items()))


def result_rows(request: TaskRequest, results: Iterable[SessionResult]) -> Iterator[tuple[ResultRow, SessionResult]]:
    """Each result of ``request`` with its row: the task is the group, the dispatch the result came from its
    ``attempts``, accepted at :data:`~polar_cli.rewards.DEFAULT_MIN_REWARD`."""
    for result in results:
        attempt = result.metadata.get(ATTEMPT_KEY)
        attempts = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1
        yield summarize(request, result.sample_index, request.task_id, attempts, result, DEFAULT_MIN_REWARD), result


# ---- a polar serve data dir ---------------------------------------------------------------------------------------


def read_only(db_path: Path) -> sqlite3.Connection:
    """``db_path`` opened read-only: no schema, no journal mode change, nothing a running server would notice."""
    try:
        db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        db.execute("PRAGMA busy_timeout=10000")
        db.execute("PRAGMA query_only=ON")
    except sqlite3.Error as exc:
        raise ConfigError(f"cannot open {db_path} read-only: {exc}") from exc
    return db


def store_tasks(data_dir: Path) -> Iterator[OnlineTask]:
    """Every task of a ``polar serve`` data dir with its sessions' results, in the order they were submitted; those
    retention compacted or removed (their traces are gone: no training data) left out."""
    db_path = data_dir / DB_NAME
    db = read_only(db_path)
    try:
        try:
            columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
            kept = "WHERE retained IS NULL " if "retained" in columns else ""  # a database older than retention
            query = f"SELECT task_id, body, created_at FROM tasks {kept}ORDER BY created_at, task_id"
            tasks = db.execute(query).fetchall()
        except sqlite3.Error as exc:
            raise ConfigError(f"{db_path}: not a polar serve database ({exc})") from exc
        for task_id, body, created_at in tasks:
            try:
                db.execute("BEGIN")  # one snapshot per task: its results as they stood together
                rows = db.execute("SELECT session_id, result FROM sessions WHERE task_id = ? AND result IS NOT NULL "
                                  "ORDER BY sample_index", (task_id,)).fetchall()  # fmt: skip
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise ConfigError(f"cannot read {db_path}: {exc}") from exc
            request = _validated(TaskRequest, body, f"{db_path}: task {task_id}")
            results = [_validated(SessionResult, r, f"{db_path}: session {s} of task {task_id}") for s, r in rows]
            yield OnlineTask(request, float(created_at), results)
    finally:
        db.close()


class StoreExport:
    """A ``polar serve`` data dir as ``polar export`` reads a ledger (``polar_cli.export.exporter.ExportSource``),
    without copying it into one: ``rows`` reads and checks every result once (one task's at a time, each task in one
    snapshot) and keeps its summary row, ``export_results`` reads each wanted result again by its session id and
    hands over the JSON the server stored. A temporary ledger would write every result twice more (its JSON, then
    its slim JSON and token arrays) and read it back."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.db_path = data_dir / DB_NAME
        self.db = read_only(self.db_path)
        self._rows: list[ResultRow] | None = None
        self._tasks: list[str] = []

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> StoreExport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self) -> list[ResultRow]:
        """Every session with a result, in dataset order (tasks as submitted, each task's by sample index); a (task,
        sample) that two results claim keeps the first, as a ledger does."""
        if self._rows is None:
            rows: dict[tuple[str, int], ResultRow] = {}
            for task in store_tasks(self.data_dir):
                self._tasks.append(task.request.task_id)
                for row, _ in result_rows(task.request, task.results):
                    rows.setdefault((row.task_id, row.sample_index), row)
            self._rows = list(rows.values())
        return self._rows

    def export_results(self, rows: Iterable[ResultRow]) -> Iterator[ExportedResult]:
        """``rows``' results as the server stored them (full JSON), streamed in their order, one at a time."""
        query = "SELECT CAST(result AS BLOB) FROM sessions WHERE session_id = ? AND result IS NOT NULL"
        for row in rows:
            try:
                found = self.db.execute(query, (row.session_id,)).fetchone()
            except sqlite3.Error as exc:
                raise ConfigError(f"cannot read {self.db_path}: {exc}") from exc
            if found is None:
                raise ConfigError(f"{self.db_path}: the result of session {row.session_id} is gone while reading it")
            yield row, bytes(found[0]), None

    def task(self, task_id: str) -> TaskRequest:
        row = self.db.execute("SELECT body FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise ConfigError(f"{self.db_path}: no task {task_id!r}")
        return _validated(TaskRequest, row[0], f"{self.db_path}: task {task_id}")

    def task_field(self, field: str) -> dict[str, str]:
        """Each task's metadata ``field`` (or its ``task_id``) as text, ``-`` where it has none, as
        :meth:`Ledger.task_field <polar_cli.generate.ledger.Ledger.task_field>` reads it."""
        if field == "task_id":
            return {t: t for t in self._read_tasks()}
        return self._extract('$.metadata."' + field.replace('"', "") + '"')

    def harnesses(self) -> dict[str, str]:
        """Each task's ``agent.harness``."""
        return self._extract("$.agent.harness")

    def _read_tasks(self) -> list[str]:
        self.rows()
        return self._tasks

    def _extract(self, path: str) -> dict[str, str]:
        """``json_extract(body, path)`` of each task read, as text (``-`` where null), as a ledger extracts it."""
        tasks = set(self._read_tasks())
        query = "SELECT task_id, json_extract(body, ?) FROM tasks"
        return {t: "-" if v is None else str(v) for t, v in self.db.execute(query, (path,)) if t in tasks}


def export_source(source: Source) -> contextlib.AbstractContextManager[Ledger | StoreExport]:
    """What ``polar export`` reads of online data: a data dir in place (:class:`StoreExport`), the other sources
    through a temporary ledger (:func:`online_ledger`; tasks on a server would be fetched twice otherwise)."""
    if not isinstance(source, ServerTasks) and input_kind(source) == "serve":
        return StoreExport(source)
    return online_ledger(source)


def _validated(model: type[M], text: str | bytes, where: str) -> M:
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"{where}: not a valid {model.__name__} ({exc.errors()[0]['msg']})") from exc


# ---- a running server ---------------------------------------------------------------------------------------------


def server_tasks(query: ServerTasks) -> Iterator[OnlineTask]:
    """The tasks ``query`` names (and those that ended since ``query.since``) from a running server, each task's
    status and body read with the server's token."""
    from polar_cli.client import PolarClient

    with PolarClient(query.url, query.token) as client:
        task_ids = list(query.task_ids)
        if query.since is not None:
            task_ids += client.ended_tasks(query.since)
        if not task_ids:
            raise ConfigError(f"no task on {client.url} ended since {query.since}: nothing to read")
        for task_id in dict.fromkeys(task_ids):
            status = client.status(task_id)
            yield OnlineTask(client.task_request(task_id), status.created_at or 0.0, status.results)


# ---- a polar status TASK --json file ------------------------------------------------------------------------------


def status_task(status: TaskStatus) -> OnlineTask:
    """A TaskStatus as a task: what its results say of the task it ran (see the module docstring)."""
    traced = next((t.metadata for r in status.results for t in r.trajectory.traces), {})
    metadata = next((r.metadata for r in status.results if r.metadata), {})
    request = TaskRequest(
        task_id=status.task_id, instruction="", num_samples=status.num_samples,
        agent=AgentSpec(harness=status.harness or str(traced.get("harness") or "unknown")),
        builder=BuilderSpec(strategy=str(traced.get("builder") or "prefix_merging")),
        metadata={k: v for k, v in metadata.items() if k not in RESULT_KEYS}
        or {k: v for k, v in traced.items() if k not in (*IDS, ATTEMPT_KEY)},
    )  # fmt: skip
    return OnlineTask(request, status.created_at or 0.0, list(status.results))
