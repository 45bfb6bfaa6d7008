"""The two exported configs' schemas and a streaming, sharded parquet writer (pyarrow, row batches)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
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
    batch_tokens: int = 4_000_000
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
        # token columns are turned into numpy arrays row by row: a buffered token costs its bytes, not a Python int
        self._numeric = {f.name: f.type.value_type.to_pandas_dtype() for f in self.schema
                         if pa.types.is_list(f.type) and pa.types.is_primitive(f.type.value_type)}  # fmt: skip

    def add(self, row: dict[str, Any], tokens: int = 0) -> None:
        for name, values in self._columns.items():
            value = row.get(name)
            dtype = self._numeric.get(name)
            values.append(value if dtype is None or value is None else np.asarray(value, dtype=dtype))
        self._buffered += 1
        self._buffered_tokens += tokens
        self.rows += 1
        if self._buffered >= self.batch_rows or self._buffered_tokens >= self.batch_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        batch = pa.RecordBatch.from_arrays([self._array(f) for f in self.schema], schema=self.schema)
        shard = self._open()
        shard.writer.write_batch(batch)
        shard.tokens += self._buffered_tokens
        for values in self._columns.values():
            values.clear()
        self._buffered = self._buffered_tokens = 0
        if shard.tokens >= self.shard_tokens:
            shard.writer.close()
            self._shard = None

    def _array(self, f: pa.Field) -> pa.Array:
        values = self._columns[f.name]
        if f.name not in self._numeric:
            return pa.array(values, type=f.type)
        lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int32, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = [v for v in values if v is not None]
        data = np.concatenate(flat) if flat else np.zeros(0, dtype=self._numeric[f.name])
        mask = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(data, type=f.type.value_type),
                                        type=f.type, mask=pa.array(mask) if mask.any() else None)  # fmt: skip

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
