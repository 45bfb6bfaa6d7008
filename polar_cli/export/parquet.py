"""The exported configs' schemas and a streaming, sharded parquet writer (pyarrow, row batches). pyarrow comes
with the ``hf`` extra: importing this module without it raises the one-line MissingDependencyError.

Encoding (measured in docs/generate.md, "polar export"): every column is zstd-compressed; the token columns
(``prompt_ids``, ``response_ids``, ``loss_mask``, ``response_logprobs``: nearly every byte of a trace) are PLAIN,
without statistics. Parquet's default, a dictionary for every column, hashes each token: it made the writer 2.6x
slower, for ids 18% smaller than zstd makes them and for logprobs, whose distinct values overflow a dictionary page,
nothing. Only the low-cardinality strings keep a dictionary, and only scalar columns have statistics.

Threads: pyarrow's ParquetWriter encodes one file on one thread (no parallel column encoding), but it lets go of the
GIL, and two threads each writing its own file go about twice as fast. So ``ShardedWriter`` runs ``threads`` writers
and gives each shard, whole, to one of them in turn, and the rows stay in order across the files read in name order.
For the writers to run side by side, a thread must hold the batches of its shard while the next thread fills the
next one: the memory bound is ``threads x shard_batches + 1`` batches, so shards are small (4 batches: ~500
realistic traces, ~70 MiB) where one thread could write files of 256M tokens. More, smaller files are the price; the
bound, not the file size, is what ``shard_batches`` trades against speed.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterator
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


def default_threads() -> int:
    """The writer's threads unless told: two, or one on a one-CPU machine (see the module docstring)."""
    return max(1, min(2, os.cpu_count() or 1))


@dataclass
class _Shard:
    """One shard file, written by one writer thread only: opened at its first batch, closed after its last."""

    path: Path
    config: str
    writer: pq.ParquetWriter | None = None

    def open(self) -> pq.ParquetWriter:
        if self.writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.path, SCHEMAS[self.config], **WRITER_OPTIONS[self.config])
        return self.writer

    def write(self, batch: pa.Table) -> None:
        self.open().write_table(batch)

    def close(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()


@dataclass
class ShardedWriter:
    """Rows of one config and split, buffered ``batch_rows`` (or ``batch_tokens``) at a time and written as row
    groups to ``<root>/<config>/<split>-NNNNN.parquet``, a new shard every ``shard_batches`` batches or
    ``shard_tokens`` tokens, whichever comes first. Shard boundaries depend on the rows alone, never on ``threads``:
    the same rows make the same files.

    ``threads`` writer threads encode and write (pyarrow lets go of the GIL) while the caller buffers the next batch:
    each shard is written whole by one thread, consecutive shards by different threads, so the rows keep their order
    when the shards are read in name order. Memory holds at most ``shard_batches`` batches queued per thread (one
    with a single thread) plus the batch being buffered: ``threads x shard_batches + 1`` batches, whatever the number
    of rows. A writer thread's error is raised by the next ``add`` or ``flush`` that finds it, or by ``close``, once
    every thread has stopped."""

    root: Path
    config: str
    split: str
    batch_rows: int = 512
    batch_tokens: int = 4_000_000
    shard_batches: int = 4
    shard_tokens: int = 256_000_000
    threads: int = field(default_factory=default_threads)
    rows: int = 0
    files: list[Path] = field(default_factory=list)
    _columns: dict[str, list[Any]] = field(default_factory=dict)
    _buffered: int = 0
    _buffered_tokens: int = 0
    _shard: _Shard | None = None
    _shard_batches: int = 0
    _shard_tokens: int = 0
    _shards: list[_Shard] = field(default_factory=list)
    _queues: list[deque[Future[None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.threads < 1 or self.shard_batches < 1:
            raise ValueError(f"threads and shard_batches must be at least 1, not {self.threads}, {self.shard_batches}")
        self.schema = SCHEMAS[self.config]
        self._columns = {name: [] for name in self.schema.names}
        # a row's token lists become one-row arrow arrays at once (the ledger's stay views of its blob): a buffered
        # token costs its bytes, not a Python int, and is never copied before the writer encodes it
        self._lists = token_columns(self.schema)
        name = f"export-{self.config}-{self.split}"
        self._workers = [ThreadPoolExecutor(1, thread_name_prefix=f"{name}-{i}") for i in range(self.threads)]
        self._queues = [deque() for _ in range(self.threads)]
        self._queued = self.shard_batches if self.threads > 1 else 1

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
        """The buffered rows to a writer thread as one batch (a thread's error found on the way is raised, after
        every thread has stopped)."""
        try:
            self._flush()
        except BaseException:
            self.abort()
            raise

    def _flush(self) -> None:
        self._raise_done()
        if not self._buffered:
            return
        columns = [pa.chunked_array(self._columns[f.name], type=f.type) if f.name in self._lists
                   else pa.array(self._columns[f.name], type=f.type) for f in self.schema]  # fmt: skip
        batch = pa.Table.from_arrays(columns, schema=self.schema)
        tokens = self._buffered_tokens
        for values in self._columns.values():
            values.clear()
        self._buffered = self._buffered_tokens = 0
        shard = self._open()
        self._submit(len(self.files) - 1, shard.write, batch)
        self._shard_batches += 1
        self._shard_tokens += tokens
        if self._shard_batches >= self.shard_batches or self._shard_tokens >= self.shard_tokens:
            self._end_shard()

    def _open(self) -> _Shard:
        """The shard being filled, named after the ones before it."""
        if self._shard is None:
            path = self.root / self.config / f"{self.split}-{len(self.files):05d}.parquet"
            self._shard = _Shard(path, self.config)
            self._shards.append(self._shard)
            self.files.append(path)
        return self._shard

    def _end_shard(self) -> None:
        """The shard being filled is complete: its thread closes it after its last batch."""
        if self._shard is not None:
            self._submit(len(self.files) - 1, self._shard.close)
            self._shard = None
            self._shard_batches = self._shard_tokens = 0

    def _submit(self, shard: int, work: Callable[..., None], *args: Any) -> None:
        """``work`` on the thread of shard number ``shard``, once that thread has at most ``_queued`` tasks queued
        (waiting for the oldest: memory stays bounded however fast the rows come)."""
        queue = self._queues[shard % self.threads]
        while len(queue) >= self._queued:
            queue.popleft().result()
        queue.append(self._workers[shard % self.threads].submit(work, *args))

    def _raise_done(self) -> None:
        """A finished task's error, if any, raised now rather than after the last row."""
        for queue in self._queues:
            while queue and queue[0].done():
                queue.popleft().result()

    def close(self) -> None:
        """Write what is buffered and close every shard; the writer threads end, even on error, and the first error a
        thread raised is raised here."""
        try:
            self._flush()
            self._end_shard()
            for queue in self._queues:
                while queue:
                    queue.popleft().result()
            if not self.files:
                empty = self._open()  # an empty split still has its schema on disk
                empty.open()
                empty.close()
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop the writer threads (what they are writing ends, what is queued is dropped) and close the shards they
        left open. Idempotent: ``close`` ends with it, and an export that fails calls it on every writer."""
        for worker in self._workers:
            worker.shutdown(cancel_futures=True)
        for shard in self._shards:
            with contextlib.suppress(Exception):  # an error already raised is the one to report
                shard.close()
