"""The exported configs' schemas and a streaming, sharded parquet writer (pyarrow, row batches). pyarrow comes
with the ``hf`` extra: importing this module without it raises the one-line MissingDependencyError.

Encoding (measured in docs/generate.md, "polar export"): every column is zstd-compressed; the token columns
(``prompt_ids``, ``response_ids``, ``loss_mask``, ``response_logprobs``: nearly every byte of a trace) are PLAIN,
without statistics. Parquet's default, a dictionary for every column, hashes each token: it made the writer 2.6x
slower, for ids 18% smaller than zstd makes them and for logprobs, whose distinct values overflow a dictionary page,
nothing. Only the low-cardinality strings keep a dictionary, and only scalar columns have statistics.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polar_cli.extras import missing

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as exc:  # a plain install: exporter imports this module only when it writes
    raise missing("pyarrow", needed_by="polar export") from exc

FUNCTION = pa.struct([("name", pa.string()), ("arguments", pa.string())])
TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", FUNCTION)])
MESSAGE = pa.struct([
    ("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
    ("tool_calls", pa.list_(TOOL_CALL)), ("tool_call_id", pa.string()), ("name", pa.string()),
])  # fmt: skip
IDS = [("session_id", pa.string()), ("task_id", pa.string()), ("instance_id", pa.string()),
       ("sample_index", pa.int32()), ("group", pa.string()), ("harness", pa.string()), ("model", pa.string()),
       ("policy_version", pa.string()), ("status", pa.string()), ("accepted", pa.bool_()),
       ("reward", pa.float64())]  # fmt: skip
VERSION_SPAN = pa.struct([("start", pa.int32()), ("version", pa.int64())])
POLICY_VERSIONS = pa.struct([("oldest", pa.int64()), ("newest", pa.int64()), ("per_completion", pa.list_(pa.int64())),
                             ("spans", pa.list_(VERSION_SPAN))])  # fmt: skip
"""A trace's ``policy_versions`` (``polar_cli.models.PolicyVersions``); null for traces that recorded none."""
TRACES = pa.schema([
    *IDS, ("chain_index", pa.int32()), ("finish_reason", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())), ("response_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
    ("response_logprobs", pa.list_(pa.float64())), ("policy_versions", POLICY_VERSIONS), ("role", pa.string()),
    ("trainable", pa.bool_()), ("context_exact", pa.bool_()), ("metadata", pa.string()),
])  # fmt: skip
TEST_STATUS = pa.struct([("test", pa.string()), ("status", pa.string())])
GRADE = pa.struct([
    ("patch_applied", pa.bool_()), ("reason", pa.string()),
    ("fail_to_pass_passed", pa.int32()), ("fail_to_pass_total", pa.int32()),
    ("pass_to_pass_passed", pa.int32()), ("pass_to_pass_total", pa.int32()),
    ("FAIL_TO_PASS", pa.list_(TEST_STATUS)), ("PASS_TO_PASS", pa.list_(TEST_STATUS)),
])  # fmt: skip
"""The evaluator's grade of a SWE session (``polar_cli.export.instance``); null for other tasks."""
INSTANCE = [("repo", pa.string()), ("problem_statement", pa.string()), ("base_commit", pa.string()),
            ("version", pa.string()), ("FAIL_TO_PASS", pa.list_(pa.string())),
            ("PASS_TO_PASS", pa.list_(pa.string())), ("resolved", pa.bool_()), ("grade", GRADE)]  # fmt: skip
"""The SWE instance columns of ``messages`` (the paper's release format); null where a task has no such field."""
MESSAGES = pa.schema([*IDS, ("messages", pa.list_(MESSAGE)), ("tools", pa.string()), ("num_turns", pa.int32()),
                      ("metadata", pa.string()), *INSTANCE])  # fmt: skip
PREFERENCES = pa.schema([
    ("instance_id", pa.string()), ("task_id", pa.string()), ("group", pa.string()), ("repo", pa.string()),
    ("prompt", pa.list_(MESSAGE)), ("chosen", pa.list_(MESSAGE)), ("rejected", pa.list_(MESSAGE)),
    ("tools", pa.string()), ("chosen_session_id", pa.string()), ("rejected_session_id", pa.string()),
    ("chosen_reward", pa.float64()), ("rejected_reward", pa.float64()), ("metadata", pa.string()),
])  # fmt: skip
"""TRL's conversational preference format (``prompt``, ``chosen``, ``rejected``) with the pair's ids."""
SCHEMAS = {"traces": TRACES, "messages": MESSAGES, "preferences": PREFERENCES}
LOW_CARDINALITY = frozenset({"task_id", "instance_id", "group", "harness", "model", "policy_version", "status",
                             "finish_reason", "role", "type", "name", "tools", "repo", "version"})  # fmt: skip
"""Names of the string leaves (top-level columns or message fields) that get a dictionary."""


NUMPY = {pa.int8(): np.int8, pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}
"""The numpy type of the token columns' values (``DataType.to_pandas_dtype``, the fallback, is slower)."""


def token_columns(schema: pa.Schema) -> dict[str, pa.ListType]:
    """The list-of-number columns and their types."""
    return {f.name: f.type for f in schema if pa.types.is_list(f.type) and pa.types.is_primitive(f.type.value_type)}


def one_row_list(value: Any, type: pa.ListType) -> pa.Array:
    """``value`` (numbers, or None) as a list array of one row. A numpy array of the list's value type is not copied:
    the ledger's token arrays, views of its blob, stay views until the writer has written them."""
    if value is None:
        return pa.nulls(1, type)
    dtype = NUMPY.get(type.value_type) or type.value_type.to_pandas_dtype()
    values = np.ascontiguousarray(value, dtype=dtype)
    offsets = pa.py_buffer(np.array([0, len(values)], dtype=np.int32))
    flat = pa.Array.from_buffers(type.value_type, len(values), [None, pa.py_buffer(values)])
    return pa.Array.from_buffers(type, 1, [None, offsets], children=[flat])


def _leaves(path: str, type: pa.DataType, in_list: bool = False) -> Iterator[tuple[str, bool]]:
    """Parquet's column paths under ``path`` (a list's values are ``path.list.element``), each with whether it is
    inside a list."""
    if pa.types.is_struct(type):
        for child in type:
            yield from _leaves(f"{path}.{child.name}", child.type, in_list)
    elif pa.types.is_list(type):
        yield from _leaves(f"{path}.list.element", type.value_type, True)
    else:
        yield path, in_list


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """``pq.ParquetWriter`` keyword arguments for ``schema`` (see the module docstring)."""
    leaves = [leaf for column in schema for leaf in _leaves(column.name, column.type)]
    return {
        "compression": "zstd",
        "use_dictionary": [path for path, _ in leaves if path.rsplit(".", 1)[-1] in LOW_CARDINALITY],
        "write_statistics": [path for path, in_list in leaves if not in_list],
    }


WRITER_OPTIONS = {config: writer_options(schema) for config, schema in SCHEMAS.items()}


@dataclass
class _Shard:
    writer: pq.ParquetWriter
    tokens: int = 0


@dataclass
class ShardedWriter:
    """Rows of one config and split, buffered ``batch_rows`` (or ``batch_tokens``) at a time and written as row
    groups to ``<root>/<config>/<split>-NNNNN.parquet``, a new shard every ``shard_tokens`` tokens. A thread of its
    own encodes and writes each batch (pyarrow lets go of the GIL) while the next one is buffered; ``flush`` waits for
    the batch before, so memory holds two batches, whatever the number of rows."""

    root: Path
    config: str
    split: str
    batch_rows: int = 512
    batch_tokens: int = 4_000_000
    shard_tokens: int = 256_000_000
    rows: int = 0
    files: list[Path] = field(default_factory=list)
    _columns: dict[str, list[Any]] = field(default_factory=dict)
    _buffered: int = 0
    _buffered_tokens: int = 0
    _shard: _Shard | None = None
    _writing: Future[None] | None = None

    def __post_init__(self) -> None:
        self.schema = SCHEMAS[self.config]
        self._columns = {name: [] for name in self.schema.names}
        # a row's token lists become one-row arrow arrays at once (the ledger's stay views of its blob): a buffered
        # token costs its bytes, not a Python int, and is never copied before the writer encodes it
        self._lists = token_columns(self.schema)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"export-{self.config}-{self.split}")

    def add(self, row: dict[str, Any], tokens: int = 0) -> None:
        for name, values in self._columns.items():
            value = row.get(name)
            values.append(value if name not in self._lists else one_row_list(value, self._lists[name]))
        self._buffered += 1
        self._buffered_tokens += tokens
        self.rows += 1
        if self._buffered >= self.batch_rows or self._buffered_tokens >= self.batch_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        columns = [pa.chunked_array(self._columns[f.name], type=f.type) if f.name in self._lists
                   else pa.array(self._columns[f.name], type=f.type) for f in self.schema]  # fmt: skip
        batch = pa.Table.from_arrays(columns, schema=self.schema)
        tokens = self._buffered_tokens
        for values in self._columns.values():
            values.clear()
        self._buffered = self._buffered_tokens = 0
        self._wait()
        self._writing = self._thread.submit(self._write, batch, tokens)

    def _write(self, batch: pa.Table, tokens: int) -> None:
        """In the writer's thread: ``batch`` (one row group) to the current shard, closed once it holds
        ``shard_tokens``."""
        shard = self._open()
        shard.writer.write_table(batch)
        shard.tokens += tokens
        if shard.tokens >= self.shard_tokens:
            shard.writer.close()
            self._shard = None

    def _wait(self) -> None:
        """Until the batch being written is on disk (its error, if any, raised here)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _open(self) -> _Shard:
        if self._shard is None:
            path = self.root / self.config / f"{self.split}-{len(self.files):05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._shard = _Shard(pq.ParquetWriter(path, self.schema, **WRITER_OPTIONS[self.config]))
            self.files.append(path)
        return self._shard

    def close(self) -> None:
        """Write what is buffered and close the last shard; the writer's thread ends, even on error."""
        try:
            self.flush()
            self._wait()
            if not self.files:
                self._open()  # an empty split still has its schema on disk
        finally:
            self._thread.shutdown()
            if self._shard is not None:
                self._shard.writer.close()
                self._shard = None
