"""Throughput and peak memory of ``polar export`` on synthetic traces of realistic size, streamed.

    python bench/export.py [--sizes 10000 100000] [--prompt 8192] [--turns 200] [--json]

Each session has one prefix-merged trace of a 200-turn session whose final prompt is 32K tokens (the shape
bench/prefix_merging.py builds): ``--prompt`` tokens of first prompt, then per turn 40 sampled tokens (loss mask 1,
with logprobs) and ``--interstitial`` tokens of tool result and template (mask 0). The results are not stored: a
synthetic source streams them through the exporter's ``ExportSource`` interface as SessionResult JSON, the form the
ledger holds, cycling over 16 distinct pre-serialized sessions, so the exporter parses every one as it would a real
ledger's. By default the sessions come as a ledger now stores them (``result_tokens``: slim JSON plus binary token
arrays, unpacked per session as ``Ledger.export_results`` does); ``--json`` streams the full JSON instead, the path
export takes for ledgers written before ``result_tokens`` existed. Each size runs in its own process (peak RSS is per
process); the parquet output goes to a temporary folder that is removed afterwards.

Reported: traces/s, tokens/s, peak RSS, and the output size.
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
from polar_cli.generate.ledger import ExportedResult, ResultRow, split_result, unpack_tokens
from polar_cli.models import SessionResult, TaskRequest

DISTINCT = 16


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
        self._task = TaskRequest(task_id="t", instruction="x", agent={"harness": "pi"}, metadata={"repo": "bench"})

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


def one(n: int, args: argparse.Namespace) -> dict[str, float]:
    blobs = [session_blob(s, args.prompt, args.turns, 40, args.interstitial) for s in range(DISTINCT)]
    tokens = args.prompt + args.turns * (40 + args.interstitial)
    source = SyntheticSource(n, blobs, tokens, args.turns, as_json=args.json)
    out = Path(tempfile.mkdtemp(prefix="polar-bench-export-", dir=args.tmp)) / "dataset"
    try:
        start = time.perf_counter()
        export(source, out, ExportOptions(test_size=0.1, stratify_by="repo"))
        seconds = time.perf_counter() - start
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"traces": n, "tokens_per_trace": tokens, "seconds": seconds, "traces_per_s": n / seconds,
            "tokens_per_s": n * tokens / seconds, "peak_rss_mib": peak, "output_mib": size / 2**20}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--prompt", type=int, default=8192, help="first-prompt tokens of each merged trace")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--interstitial", type=int, default=80, help="mask-0 tokens after each turn")
    parser.add_argument("--json", action="store_true", help="the full-JSON path (ledgers without result_tokens)")
    parser.add_argument("--tmp", default=None, help="where the temporary output goes")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args)))
        return
    rows = []
    for n in args.sizes:
        argv = [sys.executable, __file__, "--one", str(n), "--prompt", str(args.prompt), "--turns", str(args.turns),
                "--interstitial", str(args.interstitial), *(["--tmp", args.tmp] if args.tmp else []),
                *(["--json"] if args.json else [])]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"polar export, synthetic traces: {args.prompt}-token first prompt, {args.turns} turns x (40 sampled + "
          f"{args.interstitial} interstitial) tokens; {'full JSON' if args.json else 'binary token columns'}; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'traces':>8} {'tokens/trace':>12} {'seconds':>8} {'traces/s':>9} {'Mtokens/s':>9} {'peak RSS MiB':>12} "
          f"{'output MiB':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['traces']:>8} {r['tokens_per_trace']:>12} {r['seconds']:>8.1f} {r['traces_per_s']:>9.0f} "
              f"{r['tokens_per_s'] / 1e6:>9.1f} {r['peak_rss_mib']:>12.0f} {r['output_mib']:>10.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
