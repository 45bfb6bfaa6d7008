"""Throughput and peak memory of ``polar export`` on synthetic traces of realistic size, streamed, beside the I/O
ceiling.

    python bench/export.py [--sizes 10000 100000] [--prompt 8192] [--turns 200] [--small-prompt 1024]
                           [--small-turns 20] [--json] [--fsync] [--tmp DIR]

Each session has one prefix-merged trace of a 200-turn session whose final prompt is 32K tokens (the shape
bench/prefix_merging.py builds): ``--prompt`` tokens of first prompt, then per turn 40 sampled tokens (loss mask 1,
with logprobs) and ``--interstitial`` tokens of tool result and template (mask 0). The results are not stored: a
synthetic source streams them through the exporter's ``ExportSource`` interface as SessionResult JSON, the form the
ledger holds, cycling over 16 distinct pre-serialized sessions, so the exporter parses every one as it would a real
ledger's. By default the sessions come as a ledger now stores them (``result_tokens``: slim JSON plus binary token
arrays, unpacked per session as ``Ledger.export_results`` does); ``--json`` streams the full JSON instead, the path
export takes for ledgers written before ``result_tokens`` existed. Each size runs in its own process (peak RSS is per
process); the parquet output goes to a temporary folder that is removed afterwards.

Each export is followed by a ``raw write`` row, the ceiling: the same traces' token arrays (int32 ids, int8 mask,
float64 logprobs, exactly the bytes export encodes) written to a file in the same folder with one ``file.write`` per
array, no parquet, no compression; like export, it does not fsync. Both shapes run at every size: the realistic one
(``--prompt``, ``--turns``) and a small one (``--small-prompt``, ``--small-turns``; 0 skips it), where fewer tokens
per trace make the traces/s target reachable. A size whose raw bytes would not fit the free space of ``--tmp`` is
skipped, and says so.

A third row, ``parquet``, is the format's own ceiling: the same token arrays, already in Arrow arrays, written by
pyarrow's parquet writer with export's encoding (zstd, PLAIN token columns, no statistics) in export's batches and
nothing else: no parsing, no traces, no card. It is one writer on one thread: export, whose shards go to two writer
threads by default (``ExportOptions.threads``), can pass it. Export's share of it is what Polar's own work costs (or,
above 100%, what its threads gain); the parquet row's share of the raw write is what the format costs on this
machine.

Reported per row: traces/s, tokens/s, MiB written and MiB/s, peak RSS; the header has the CPUs and the load average.
After each size's pair of rows, and again at the end, export's traces/s as a fraction of the raw write's (the goal:
at least 50%). ``--fsync`` makes both rows flush what they wrote (each file's ``fsync``) before the clock stops: the
ceiling is then the disk's sustained write speed rather than the page cache's, which is what a raw write of a few GiB
measures on a machine with the memory to hold them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polar_cli.export import ExportOptions, export
from polar_cli.gateway.results import fsync_path
from polar_cli.generate.ledger import ExportedResult, ResultRow, split_result, unpack_tokens
from polar_cli.models import AgentSpec, SessionResult, TaskRequest

DISTINCT = 16
SAMPLED = 40


def session_blob(seed: int, prompt: int, turns: int, sampled: int, interstitial: int) -> bytes:
    rng = random.Random(seed)
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[dict[str, float | int]] = []
    for _ in range(turns):
        for _ in range(sampled):
            token = rng.randrange(150_000)
            response.append(token)
            mask.append(1)
            logprobs.append({"token_id": token, "logprob": -rng.random() * 3})
        for _ in range(interstitial):
            token = rng.randrange(150_000)
            response.append(token)
            mask.append(0)
            logprobs.append({"token_id": token, "logprob": 0.0})
    trace = {"prompt_ids": [rng.randrange(150_000) for _ in range(prompt)], "response_ids": response,
             "loss_mask": mask, "response_logprobs": logprobs, "prompt_messages": [], "response_messages": [],
             "tools": None, "finish_reason": "stop", "reward": 1.0,
             "metadata": {"chain": 0, "builder": "prefix_merging", "harness": "pi"}}  # fmt: skip
    result = {"session_id": f"s{seed}", "task_id": "t", "sample_index": 0, "status": "completed",
              "trajectory": {"status": "completed", "traces": [trace]}, "reward": 1.0, "num_completions": turns,
              "metadata": {}}  # fmt: skip
    return orjson.dumps(result)


class SyntheticSource:
    """``n`` sessions of one trace each, in 100 groups, streamed (nothing but 16 blobs is held)."""

    def __init__(self, n: int, blobs: list[bytes], tokens: int, turns: int, *, as_json: bool = False) -> None:
        self.n, self.blobs, self.tokens, self.turns, self.as_json = n, blobs, tokens, turns, as_json
        self.columnar = [] if as_json else [split_result(SessionResult.model_validate_json(b)) for b in blobs]
        self._task = TaskRequest(
            task_id="t", instruction="x", agent=AgentSpec(harness="pi"), metadata={"repo": "bench"}
        )

    def _row(self, i: int) -> ResultRow:
        return ResultRow(f"task-{i}", 0, f"session-{i}", f"repo-{i % 100}", 1, "completed", 1.0, True,
                         self.turns * 40, self.tokens, self.turns, 1)  # fmt: skip

    def rows(self) -> list[ResultRow]:
        return [self._row(i) for i in range(self.n)]  # summaries only, ~200 bytes each

    def export_results(self, rows: Iterable[ResultRow]) -> Iterator[ExportedResult]:
        for row in rows:
            i = int(row.task_id.removeprefix("task-"))
            if self.as_json:
                yield row, self.blobs[i % DISTINCT], None
            else:
                columnar = self.columnar[i % DISTINCT]
                assert columnar is not None
                yield row, columnar[0], unpack_tokens(columnar[1])

    def task(self, task_id: str) -> TaskRequest:
        return self._task

    def task_field(self, field: str) -> dict[str, str]:
        return {f"task-{i}": f"repo-{i % 100}" for i in range(self.n)}

    def harnesses(self) -> dict[str, str]:
        return {f"task-{i}": self._task.agent.harness for i in range(self.n)}


def shape_blobs(args: argparse.Namespace) -> tuple[list[bytes], int]:
    blobs = [session_blob(s, args.prompt, args.turns, SAMPLED, args.interstitial) for s in range(DISTINCT)]
    return blobs, args.prompt + args.turns * (SAMPLED + args.interstitial)


def measured(n: int, tokens: int, seconds: float, written: int) -> dict[str, float]:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"traces": n, "tokens_per_trace": tokens, "seconds": seconds, "traces_per_s": n / seconds,
            "tokens_per_s": n * tokens / seconds, "written_mib": written / 2**20,
            "mib_per_s": written / 2**20 / seconds, "peak_rss_mib": peak}  # fmt: skip


def one_export(n: int, args: argparse.Namespace) -> dict[str, float]:
    blobs, tokens = shape_blobs(args)
    source = SyntheticSource(n, blobs, tokens, args.turns, as_json=args.json)
    out = Path(tempfile.mkdtemp(prefix="polar-bench-export-", dir=args.tmp)) / "dataset"
    try:
        start = time.perf_counter()
        export(source, out, ExportOptions(test_size=0.1, stratify_by="repo"))
        files = [p for p in out.rglob("*") if p.is_file()]
        if args.fsync:
            for path in files:
                fsync_path(path)
        seconds = time.perf_counter() - start
        size = sum(p.stat().st_size for p in files)
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    return measured(n, tokens, seconds, size)


def one_raw_write(n: int, args: argparse.Namespace) -> dict[str, float]:
    """The ceiling: ``n`` traces' token arrays (the 16 distinct ones, cycled) written as they are."""
    blobs, tokens = shape_blobs(args)
    arrays = []
    for blob in blobs:
        columnar = split_result(SessionResult.model_validate_json(blob))
        assert columnar is not None
        t = unpack_tokens(columnar[1])[0]
        arrays.append([a for a in (t.prompt_ids, t.response_ids, t.loss_mask, t.response_logprobs) if a is not None])
    folder = Path(tempfile.mkdtemp(prefix="polar-bench-raw-", dir=args.tmp))
    try:
        start = time.perf_counter()
        with (folder / "tokens.bin").open("wb", buffering=0) as f:
            for i in range(n):
                for array in arrays[i % DISTINCT]:
                    f.write(array.data)
            if args.fsync:
                os.fsync(f.fileno())
        seconds = time.perf_counter() - start
        size = (folder / "tokens.bin").stat().st_size
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return measured(n, tokens, seconds, size)


def one_parquet(n: int, args: argparse.Namespace) -> dict[str, float]:
    """The format's ceiling: ``n`` traces' token arrays as Arrow list arrays, written by pyarrow's parquet writer with
    the traces config's options for those columns, in export's batches (``ShardedWriter``'s rows or tokens)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from polar_cli.export.parquet import TRACES, ShardedWriter, writer_options

    blobs, tokens = shape_blobs(args)
    names = ["prompt_ids", "response_ids", "loss_mask", "response_logprobs"]
    schema = pa.schema([TRACES.field(name) for name in names])
    distinct = []
    for blob in blobs:
        columnar = split_result(SessionResult.model_validate_json(blob))
        assert columnar is not None
        t = unpack_tokens(columnar[1])[0]
        distinct.append([t.prompt_ids, t.response_ids, t.loss_mask, t.response_logprobs])
    batch_rows = max(1, min(ShardedWriter.batch_rows, ShardedWriter.batch_tokens // tokens))
    rows = [distinct[i % DISTINCT] for i in range(batch_rows)]
    batch = pa.Table.from_arrays(
        [pa.array([row[c] for row in rows], type=schema.field(c).type) for c in range(len(names))], schema=schema
    )
    folder = Path(tempfile.mkdtemp(prefix="polar-bench-parquet-", dir=args.tmp))
    path = folder / "traces.parquet"
    try:
        start = time.perf_counter()
        with pq.ParquetWriter(path, schema, **writer_options(schema)) as writer:
            for done in range(0, n, batch_rows):
                writer.write_table(batch.slice(0, min(batch_rows, n - done)))
        if args.fsync:
            fsync_path(path)
        seconds = time.perf_counter() - start
        size = path.stat().st_size
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return measured(n, tokens, seconds, size)


def raw_bytes(prompt: int, turns: int, interstitial: int) -> int:
    """One trace's token bytes: int32 ids, then per response token an int8 mask and a float64 logprob."""
    return 4 * prompt + (4 + 1 + 8) * turns * (SAMPLED + interstitial)


def run(what: str, n: int, prompt: int, turns: int, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, __file__, f"--{what}", str(n), "--prompt", str(prompt), "--turns", str(turns),
            "--interstitial", str(args.interstitial), *(["--tmp", args.tmp] if args.tmp else []),
            *(["--json"] if args.json else []), *(["--fsync"] if args.fsync else [])]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ)
    return json.loads(done.stdout.strip().splitlines()[-1])


TARGET = 20_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--prompt", type=int, default=8192, help="first-prompt tokens of each merged trace")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--small-prompt", type=int, default=1024, help="the small shape's first prompt (0: skip it)")
    parser.add_argument("--small-turns", type=int, default=20)
    parser.add_argument("--interstitial", type=int, default=80, help="mask-0 tokens after each turn")
    parser.add_argument("--json", action="store_true", help="the full-JSON path (ledgers without result_tokens)")
    parser.add_argument("--tmp", default=None, help="where the temporary output goes")
    parser.add_argument("--fsync", action="store_true", help="both rows fsync what they wrote before the clock stops")
    parser.add_argument("--export", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--raw-write", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--parquet", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export is not None:
        print(json.dumps(one_export(args.export, args)))
        return
    if args.raw_write is not None:
        print(json.dumps(one_raw_write(args.raw_write, args)))
        return
    if args.parquet is not None:
        print(json.dumps(one_parquet(args.parquet, args)))
        return
    shapes = [("realistic", args.prompt, args.turns)]
    if args.small_prompt:
        shapes.append(("small", args.small_prompt, args.small_turns))
    free = shutil.disk_usage(args.tmp or tempfile.gettempdir()).free
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"polar export, synthetic traces of one merged trace each: first prompt + turns x ({SAMPLED} sampled + "
          f"{args.interstitial} interstitial) tokens; {'full JSON' if args.json else 'binary token columns'}; "
          f"{os.cpu_count()} CPUs, load average {load} at the start; target {TARGET:,} traces/s")  # fmt: skip
    header = (f"{'shape':<10} {'prompt+turns':>12} {'tokens/trace':>12} {'what':<9} {'traces':>7} {'seconds':>8} "
              f"{'traces/s':>9} {'Mtokens/s':>9} {'written MiB':>11} {'MiB/s':>6} {'peak RSS MiB':>12}")  # fmt: skip
    print(header)
    best: dict[str, float] = {}
    ratios: list[str] = []
    for shape, prompt, turns in shapes:
        for n in args.sizes:
            speed: dict[str, float] = {}
            for what in ("export", "parquet", "raw-write"):
                need = n * raw_bytes(prompt, turns, args.interstitial)
                label = f"{shape:<10} {f'{prompt}+{turns}':>12} {'':>12} {what:<9} {n:>7}"
                if need > 0.9 * free:
                    print(f"{label} skipped: needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free (use --tmp)")
                    continue
                r = run(what, n, prompt, turns, args)
                speed[what] = r["traces_per_s"]
                best[f"{shape} {what}"] = max(best.get(f"{shape} {what}", 0.0), r["traces_per_s"])
                print(f"{shape:<10} {f'{prompt}+{turns}':>12} {r['tokens_per_trace']:>12} {what:<9} {n:>7} "
                      f"{r['seconds']:>8.1f} {r['traces_per_s']:>9.0f} {r['tokens_per_s'] / 1e6:>9.1f} "
                      f"{r['written_mib']:>11.0f} {r['mib_per_s']:>6.0f} {r['peak_rss_mib']:>12.0f}",
                      flush=True)  # fmt: skip
            if len(speed) == 3:
                ratio = (f"{shape} at {n:,}: export {speed['export']:,.0f} traces/s = "
                         f"{speed['export'] / speed['raw-write']:.0%} of the raw write's {speed['raw-write']:,.0f} "
                         f"(goal: 50%); the parquet writer alone {speed['parquet']:,.0f} = "
                         f"{speed['parquet'] / speed['raw-write']:.0%} of it, export "
                         f"{speed['export'] / speed['parquet']:.0%} of the parquet writer's")  # fmt: skip
                ratios.append(ratio)
                print(ratio, flush=True)
    print(f"load average {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    for ratio in ratios:
        print(ratio)
    for shape, _, _ in shapes:
        if f"{shape} export" in best:
            e, c = best[f"{shape} export"], best.get(f"{shape} raw-write")
            print(f"{shape}: export at best {e:,.0f} traces/s = {e / TARGET:.0%} of the target" +
                  ("" if c is None else f"; raw write of the same bytes {c:,.0f} traces/s"))  # fmt: skip

if __name__ == "__main__":
    main()
