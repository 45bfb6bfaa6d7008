"""The two exported configs' schemas and a streaming, sharded parquet writer (pyarrow, row batches)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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
TRACES = pa.schema([
    *IDS, ("chain_index", pa.int32()), ("finish_reason", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())), ("response_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
    ("response_logprobs", pa.list_(pa.float64())), ("metadata", pa.string()),
])  # fmt: skip
MESSAGES = pa.schema([*IDS, ("messages", pa.list_(MESSAGE)), ("tools", pa.string()), ("num_turns", pa.int32()),
                      ("metadata", pa.string())])  # fmt: skip
SCHEMAS = {"traces": TRACES, "messages": MESSAGES}


@dataclass
class _Shard:
    writer: pq.ParquetWriter
    tokens: int = 0


@dataclass
class ShardedWriter:
    """Rows of one config and split, buffered ``batch_rows`` (or ``batch_tokens``) at a time and written as record
    batches to ``<root>/<config>/<split>-NNNNN.parquet``, a new shard every ``shard_tokens`` tokens: memory holds one
    batch, whatever the number of rows."""

    root: Path
    config: str
    split: str
    batch_rows: int = 512
    batch_tokens: int = 8_000_000
    shard_tokens: int = 256_000_000
    rows: int = 0
    files: list[Path] = field(default_factory=list)
    _columns: dict[str, list[Any]] = field(default_factory=dict)
    _buffered: int = 0
    _buffered_tokens: int = 0
    _shard: _Shard | None = None

    def __post_init__(self) -> None:
        self.schema = SCHEMAS[self.config]
        self._columns = {name: [] for name in self.schema.names}

    def add(self, row: dict[str, Any], tokens: int = 0) -> None:
        for name, values in self._columns.items():
            values.append(row.get(name))
        self._buffered += 1
        self._buffered_tokens += tokens
        self.rows += 1
        if self._buffered >= self.batch_rows or self._buffered_tokens >= self.batch_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        batch = pa.RecordBatch.from_arrays(
            [pa.array(self._columns[f.name], type=f.type) for f in self.schema], schema=self.schema
        )
        shard = self._open()
        shard.writer.write_batch(batch)
        shard.tokens += self._buffered_tokens
        for values in self._columns.values():
            values.clear()
        self._buffered = self._buffered_tokens = 0
        if shard.tokens >= self.shard_tokens:
            shard.writer.close()
            self._shard = None

    def _open(self) -> _Shard:
        if self._shard is None:
            path = self.root / self.config / f"{self.split}-{len(self.files):05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._shard = _Shard(pq.ParquetWriter(path, self.schema, compression="zstd"))
            self.files.append(path)
        return self._shard

    def close(self) -> None:
        self.flush()
        if not self.files:
            self._open()  # an empty split still has its schema on disk
        if self._shard is not None:
            self._shard.writer.close()
            self._shard = None
