"""The places Polar writes sessions, as the readers of finished work (``polar verify``, ``polar view``,
``polar export``) find them: one module tells them apart and reads their records, so every reader accepts the same
inputs with the same errors.

* ``results``: a ``polar run --out`` file, one SessionResult (JSON) a line; a JSON list (``polar run --json``) too;
* ``generate``: a ``polar generate`` output folder (its ``ledger.db``);
* ``dataset``: a ``polar export`` folder (``<config>/*.parquet`` shards), or one ``.parquet`` shard;
* ``serve``: a ``polar serve`` data dir (its ``server.db``; a gateway's journals in ``journal/`` beside it);
* ``status``: a ``polar status TASK --json`` file (one TaskStatus, its SessionResults included);
* and, not a path, :class:`ServerTasks`: tasks on a running ``polar serve`` (``--server URL --task ID``).

The last three are online data: :mod:`polar_cli.online` reads them as a ``polar generate`` folder.
Records come back as decoded JSON (results) or parquet rows (datasets): each reader validates them its own way
(``polar verify`` keeps a trace that does not validate, to report it by name).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from polar_cli.client import SERVER_ENV
from polar_cli.errors import ConfigError
from polar_cli.generate.ledger import LEDGER
from polar_cli.models import TaskStatus
from polar_cli.models.base import describe_validation_error
from polar_cli.server.config import DB_NAME

InputKind = Literal["results", "generate", "dataset", "serve", "status"]
ONLINE_KINDS: tuple[InputKind, ...] = ("serve", "status")
"""The kinds of path that hold online data (read through :mod:`polar_cli.online`)."""
STATUS_KEYS = frozenset({"task_id", "state", "num_samples", "sessions", "results"})
"""The keys that make a JSON object a TaskStatus (a SessionResult has none of ``state``, ``sessions``)."""
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class ServerTasks:
    """Tasks on a running ``polar serve``, read over its HTTP API: ``task_ids``, and every task that ended at or
    after ``since`` (seconds since the epoch) when it is set. ``url``/``token`` None: ``$POLAR_SERVER`` /
    ``$POLAR_TOKEN``."""

    url: str | None
    token: str | None
    task_ids: tuple[str, ...] = ()
    since: float | None = None

    def __str__(self) -> str:
        which = [*self.task_ids, *([] if self.since is None else [f"tasks ended since {self.since:.0f}"])]
        return f"{self.url or '$POLAR_SERVER'} ({', '.join(which)})"


Source = Path | ServerTasks
"""What a reading command reads: a path of one of the kinds, or tasks on a server."""


def parse_since(value: str, *, now: float | None = None) -> float:
    """``--since``: seconds since the epoch, an ISO 8601 time (local time unless it names its zone) or a duration
    back from now (``90s``, ``30m``, ``2h``, ``1d``); ConfigError naming the value otherwise."""
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    unit = DURATION_UNITS.get(text[-1:].lower())
    if unit is not None:
        try:
            return (time.time() if now is None else now) - float(text[:-1]) * unit
        except ValueError:
            pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ConfigError(
            f"--since {value!r}: not a time (seconds since the epoch, an ISO 8601 time such as 2026-01-31T12:00, or "
            "a duration back from now such as 30m, 2h, 1d)"
        ) from None


def command_source(path: Path | None, *, server: str | None, token: str | None, tasks: Sequence[str] | None,
                   since: str | None) -> Source:  # fmt: skip
    """A reading command's input from its arguments: PATH, or ``--server URL`` with ``--task ID`` (repeatable)
    and/or ``--since WHEN``; ConfigError for any other combination."""
    remote = bool(tasks) or since is not None
    if path is not None:
        if remote or server is not None:
            raise ConfigError("give either PATH or --server URL with --task ID / --since WHEN, not both")
        return path
    if not remote:
        if server is not None:
            raise ConfigError("--server needs the tasks to read: --task ID (repeatable) or --since WHEN")
        raise ConfigError("nothing to read: give a PATH, or --server URL with --task ID (repeatable) or --since WHEN")
    if server is None and not os.environ.get(SERVER_ENV):
        flag = "--task" if tasks else "--since"
        raise ConfigError(f"{flag} reads tasks on a running polar serve: give its URL with --server URL (or set "
                          f"${SERVER_ENV})")  # fmt: skip
    return ServerTasks(server, token, tuple(dict.fromkeys(tasks or ())), None if since is None else parse_since(since))


def input_kind(path: Path) -> InputKind:
    """What ``path`` is; ConfigError naming the path when it is none of the kinds."""
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / LEDGER).is_file():
            return "generate"
        if (path / "traces").is_dir():
            return "dataset"
        if (path / DB_NAME).is_file():
            return "serve"
        raise ConfigError(
            f"{path} is none of a polar generate folder (no {LEDGER}), an exported dataset (no traces/ folder) or a "
            f"polar serve data dir (no {DB_NAME})"
        )
    if path.suffix == ".parquet":
        return "dataset"
    return "status" if _task_status_data(path) is not None else "results"


def _task_status_data(path: Path) -> dict[str, Any] | None:
    """The file's one JSON object when it is a TaskStatus's (``polar status TASK --json``), else None."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if data.lstrip()[:1] != b"{":
        return None
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None  # JSON lines (a results file), or not JSON at all: the results reader says which
    return document if isinstance(document, dict) and document.keys() >= STATUS_KEYS else None


def task_status_file(path: Path) -> TaskStatus:
    """A ``polar status TASK --json`` file's TaskStatus; ConfigError naming the file when it is not one."""
    data = _task_status_data(path)
    if data is None:
        raise ConfigError(f"{path} is not the output of polar status TASK --json (one TaskStatus)")
    try:
        return TaskStatus.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: not a TaskStatus: {describe_validation_error(exc, TaskStatus)}") from exc


def results_records(path: Path) -> list[tuple[str, Any]]:
    """Every SessionResult of a results file as decoded JSON, each with where it is (``FILE:LINE``, or
    ``FILE[N]`` in a JSON list); ConfigError for a file that cannot be read, is not JSON or holds none."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        if data.lstrip()[:1] == b"[":
            items = orjson.loads(data)
            if not isinstance(items, list):
                raise ConfigError(f"{path}: not a list of SessionResults")
            records = [(f"{path}[{n}]", item) for n, item in enumerate(items)]
        else:
            records = [(f"{path}:{n}", orjson.loads(line)) for n, line in enumerate(data.splitlines(), 1)
                       if line.strip()]  # fmt: skip
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a results file (JSON lines of SessionResults): {exc}") from exc
    if not records:
        raise ConfigError(f"{path} holds no SessionResult")
    return records


def dataset_shards(path: Path, config: str = "traces") -> list[Path]:
    """The parquet shards of one config of an exported dataset (``path`` itself when it is a shard); ConfigError
    when the ``traces`` config has none (a missing other config is just empty)."""
    if path.is_file():
        return [path] if config == "traces" else []
    files = sorted((path / config).glob("*.parquet"))
    if not files and config == "traces":
        raise ConfigError(f"{path}: no traces/*.parquet here (not a polar export folder)")
    return files


def shard_rows(file: Path, *, needed_by: str) -> Iterator[dict[str, Any]]:
    """The rows of one parquet shard; ConfigError when it cannot be read as parquet."""
    from polar_cli.extras import require

    pq = require("pyarrow.parquet", needed_by=needed_by, extra="hf")
    try:
        rows = pq.read_table(file).to_pylist()
    except Exception as exc:  # pyarrow's errors have no common base worth naming
        raise ConfigError(f"cannot read {file} as parquet: {exc}") from exc
    yield from rows


def row_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """An exported row's ``metadata`` column (a JSON string) as a dict."""
    raw = row.get("metadata")
    meta = orjson.loads(raw) if raw else {}
    return meta if isinstance(meta, dict) else {}
