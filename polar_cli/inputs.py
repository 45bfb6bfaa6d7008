"""The three places Polar writes sessions, as the readers of finished work (``polar verify``, ``polar view``) find
them: one module tells them apart and reads their records, so every reader accepts the same inputs with the same
errors.

* ``results``: a ``polar run --out`` file, one SessionResult (JSON) a line; a JSON list (``polar run --json``) too;
* ``generate``: a ``polar generate`` output folder (its ``ledger.db``);
* ``dataset``: a ``polar export`` folder (``<config>/*.parquet`` shards), or one ``.parquet`` shard.

Records come back as decoded JSON (results) or parquet rows (datasets): each reader validates them its own way
(``polar verify`` keeps a trace that does not validate, to report it by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from polar_cli.errors import ConfigError
from polar_cli.generate.ledger import LEDGER

InputKind = Literal["results", "generate", "dataset"]


def input_kind(path: Path) -> InputKind:
    """What ``path`` is; ConfigError naming the path when it is none of the three."""
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / LEDGER).is_file():
            return "generate"
        if (path / "traces").is_dir():
            return "dataset"
        raise ConfigError(
            f"{path} is neither a polar generate folder (no {LEDGER}) nor an exported dataset (no traces/ folder)"
        )
    return "dataset" if path.suffix == ".parquet" else "results"


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
