"""``polar verify --recompute``'s scoring (polar_cli.recompute.logprobs.CausalLM): speed and peak memory of chunked
prefill against one pass, and each dtype's logprob error against float32 on the same tokens.

    python bench/recompute.py [--model DIR] [--tokens 32768] [--chunks 0,2048] [--dtypes float32,bfloat16]
                              [--device cpu] [--traces PATH]

Without ``--traces`` the sequence is ``--tokens`` random token ids (seed 0), its second half scored, as in a trace
whose prompt is half of it; with ``--traces`` (anything ``polar verify`` reads) each trace's sampled (mask-1) tokens
are scored. ``--model`` defaults to the demo model (polar_cli/demo_model.py, built into a temporary folder). Each
(dtype, chunk size) runs in a fresh process, so its peak memory is its own: on the CPU the growth of the peak RSS
over the RSS once the model is loaded, on a GPU ``torch.cuda.max_memory_allocated`` (weights included). The error
columns compare each run's logprobs with those of the float32 run in one pass (chunk 0; the first float32 run when
there is none).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sequences(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], list[int]]]:
    """(ids, scored positions) of each sequence the bench scores."""
    if args.traces is None:
        rng = random.Random(0)
        ids = [rng.randrange(vocab) for _ in range(args.tokens)]
        return [(ids, list(range(args.tokens // 2, args.tokens)))]
    from polar_cli.recompute import load_traces

    out = []
    for loaded in load_traces(Path(args.traces)):
        trace, base = loaded.trace, len(loaded.trace.prompt_ids)
        positions = [base + i for i, bit in enumerate(trace.loss_mask) if bit == 1 and base + i > 0]
        if positions:
            out.append(([*trace.prompt_ids, *trace.response_ids], positions))
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One (dtype, chunk size): load, score every sequence, measure."""
    from polar_cli.recompute.logprobs import CausalLM

    model = CausalLM(Path(args.model), args.dtype, args.device, args.chunk)
    torch = model.torch
    work = sequences(args, model.vocab_size)
    gpu = model.placement.gpus > 0
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    loaded = 0 if gpu else rss_bytes()
    began = time.perf_counter()
    logprobs = [x for ids, positions in work for x in model.logprobs(ids, positions)]
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    if gpu:
        peak = torch.cuda.max_memory_allocated()  # the weights included, as the figures
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - loaded
    tokens = sum(max(positions) for _, positions in work)
    return {"dtype": args.dtype, "chunk": args.chunk, "placement": str(model.placement), "tokens": tokens,
            "scored": len(logprobs), "seconds": seconds, "peak_bytes": max(peak, 0), "logprobs": logprobs}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model folder (default: the demo model)")
    parser.add_argument("--tokens", type=int, default=32768, help="the random sequence's length (without --traces)")
    parser.add_argument("--traces", help="score these traces' sampled tokens instead of a random sequence")
    parser.add_argument("--chunks", default="0,2048", help="chunk sizes, comma-separated (0: one pass)")
    parser.add_argument("--dtypes", default="float32", help="dtypes, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dtype is not None:  # a child
        print(json.dumps(child(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from polar_cli.demo_model import build_demo_model

            args.model = str(build_demo_model(Path(tmp) / "demo"))
        runs = []
        for dtype in args.dtypes.split(","):
            for chunk in (int(c) for c in args.chunks.split(",")):
                command = [sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens), "--device",
                           args.device, "--dtype", dtype, "--chunk", str(chunk)]  # fmt: skip
                if args.traces:
                    command += ["--traces", args.traces]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"{dtype} chunk {chunk}: failed\n{done.stderr[-2000:]}")
                    continue
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"model {args.model}, device {args.device}, " + (f"traces {args.traces}" if args.traces else
          f"{args.tokens} random tokens, the second half scored"))  # fmt: skip
    print("| dtype | chunk | placement | tokens | scored | s | tokens/s | peak memory (MiB) | max abs Δ vs float32 | "
          "mean abs Δ vs float32 |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
    for run in runs:
        refs = [r for r in runs if r["dtype"] == "float32"]
        ref = next((r for r in refs if r["chunk"] == 0), refs[0] if refs else None)
        deltas = [abs(a - b) for a, b in zip(run["logprobs"], ref["logprobs"], strict=True)] if ref else []
        error = f"{max(deltas):.2e} | {sum(deltas) / len(deltas):.2e}" if deltas else "- | -"
        print(f"| {run['dtype']} | {run['chunk'] or 'one pass'} | {run['placement']} | {run['tokens']} | "
              f"{run['scored']} | {run['seconds']:.2f} | {run['tokens'] / run['seconds']:.0f} | "
              f"{run['peak_bytes'] / 2**20:.0f} | {error} |")  # fmt: skip


if __name__ == "__main__":
    main()
