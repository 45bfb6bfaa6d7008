"""The parquet writer's threads: several threads write the very files one thread writes (rows in order when read in
name order, an empty split with its schema), and an error in a writer thread is raised to the caller."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from polar_cli.export import ExportOptions, export
from polar_cli.export.parquet import ShardedWriter
from polar_cli.generate.ledger import Ledger, ResultRow
from polar_cli.models import SessionResult, TaskRequest, Trace, Trajectory

pq = pytest.importorskip("pyarrow.parquet")


def _rows(folder: Path, config: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each shard's name and rows, in name order (the order readers and ``datasets`` read them in)."""
    return [(f.name, pq.read_table(f).to_pylist()) for f in sorted((folder / config).glob("*.parquet"))]


def _trace_row(i: int) -> dict[str, Any]:
    return {"session_id": f"s{i}", "group": f"g{i // 3}", "prompt_ids": list(range(i, i + 5)), "response_ids": [i],
            "loss_mask": [1], "response_logprobs": [-0.5 * i], "trainable": True}  # fmt: skip


def _write(root: Path, split: str, rows: int, threads: int) -> ShardedWriter:
    writer = ShardedWriter(root, "traces", split, batch_rows=2, shard_batches=2, threads=threads)
    for i in range(rows):
        writer.add(_trace_row(i), tokens=6)
    writer.close()
    return writer


def test_several_threads_write_the_files_and_rows_one_thread_writes(tmp_path: Path) -> None:
    one = _write(tmp_path / "one", "train", 23, threads=1)
    three = _write(tmp_path / "three", "train", 23, threads=3)
    assert [f.name for f in one.files] == [f.name for f in three.files] == [f"train-{i:05d}.parquet" for i in range(6)]
    assert _rows(tmp_path / "three", "traces") == _rows(tmp_path / "one", "traces")
    read = [row for _, rows in _rows(tmp_path / "three", "traces") for row in rows]
    assert [r["session_id"] for r in read] == [f"s{i}" for i in range(23)]  # in order, so each group contiguous
    assert read[22]["prompt_ids"] == list(range(22, 27)) and read[22]["response_logprobs"] == [-11.0]
    empty = _write(tmp_path / "three", "test", 0, threads=3)
    assert pq.read_table(empty.files[0]).num_rows == 0
    assert pq.read_schema(empty.files[0]).names == pq.read_schema(three.files[0]).names


def test_an_error_in_a_writer_thread_is_raised_and_every_thread_ends(tmp_path: Path) -> None:
    (tmp_path / "traces" / "train-00001.parquet").mkdir(parents=True)  # the second shard, on the second thread
    before = set(threading.enumerate())
    with pytest.raises(OSError, match=r"train-00001\.parquet"):
        _write(tmp_path, "train", 23, threads=2)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("export-")]


def _result(task_id: str, i: int) -> SessionResult:
    logprobs = [{"token_id": 3, "logprob": -0.5}, {"token_id": i, "logprob": -0.25 * i}]
    trace = Trace(prompt_ids=[i, 2], response_ids=[3, i], loss_mask=[1, 1], response_logprobs=logprobs)
    return SessionResult(session_id=f"{task_id}-s", task_id=task_id, status="completed", reward=1.0,
                         trajectory=Trajectory(status="completed", traces=[trace]), num_completions=1)  # fmt: skip


def test_export_with_several_threads_gives_the_rows_of_one_thread_in_order(tmp_path: Path) -> None:
    with Ledger(tmp_path / "gen") as ledger:
        for i in range(21):
            task = TaskRequest(task_id=f"t{i:02d}", instruction="x", agent={"harness": "pi"},
                               metadata={"repo": f"r{i % 3}"})  # fmt: skip
            ledger.remember_task(i, task.metadata["repo"], task)
            row = ResultRow(task.task_id, 0, f"t{i:02d}-s", f"r{i % 3}", 1, "completed", 1.0, True, 2, 4, 1, 1)
            assert ledger.finish(row, _result(task.task_id, i))
    reports = [export(tmp_path / "gen", tmp_path / f"ds{n}", ExportOptions(threads=n, test_size=0.2), batch_rows=2)
               for n in (1, 2)]  # fmt: skip
    assert reports[0].rows == reports[1].rows and reports[0].rows["traces"]["train"] > 8  # more than one shard
    for config in ("traces", "messages"):
        shards = _rows(tmp_path / "ds1", config)
        assert len(shards) > 2 and _rows(tmp_path / "ds2", config) == shards
    with pytest.raises(ValidationError, match="threads"):
        ExportOptions(threads=0)
