"""Benchmark: INIT time and throughput of short SWE-like Docker sessions with fresh containers, a warm pool, and a
pool with reuse (``runtime.reuse: reset``).

A real gateway node (in process) runs ``--sessions`` sessions of one task on a SWE-like image built from
``polar-test-base:latest`` (a git repository with a buggy script and its test; ``prepare`` sleeps
``--prepare-seconds``, standing for a real environment's setup). The agent is short: a bash script makes one
scripted model call over ``/dev/tcp`` and fixes the script with ``sed`` (``--agent reference``: the shell harness's
Node reference agent, two model calls and a tool call); ``test_on_output`` scores it.

- ``fresh``: no pool (``sandbox_pool.max: 0``, the default): every INIT starts a container and runs prepare;
- ``warm pool``: ``min = max = sessions``, filled before the first session is submitted (the fill time is shown
  apart): INIT takes a ready container; each is stopped after its session;
- ``pool + reuse``: ``min = max = --pool`` containers filled first, ``reuse: reset``: after each session its
  container is reset (git reset/clean, files outside the repository removed, the check run) and serves the next.

INIT seconds are each session's ``stage_seconds.init`` (with reuse, a session that finds no ready container waits
there for one being reset); sessions per minute count from the first submission to the last result; run, evaluate
and teardown are means per session. Goals: INIT p50 <= 0.3 s from a warm pool, >= 3x the sessions per minute of
fresh containers.

    python bench/sandboxes.py [--sessions 32] [--workers 8] [--pool 8] [--prepare-seconds 2] [--agent bash|reference]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import TaskRequest
from tests.support.swe_image import FIX, build_image, remove_image, swe_task

BASE_IMAGE = "polar-test-base:latest"


@dataclass(frozen=True)
class Measurement:
    name: str
    init: list[float]
    seconds: float
    fill_seconds: float | None
    statuses: set[str]
    resets: int
    stages: dict[str, float]
    """Mean seconds per stage (SessionResult.stage_seconds)."""

    def quantile(self, q: float) -> float:
        ordered = sorted(self.init)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def per_minute(self) -> float:
        return len(self.init) / self.seconds * 60


async def measure(name: str, task: TaskRequest, args: argparse.Namespace, pool: int, scratch: Path) -> Measurement:
    config = GatewayConfig(port=0, data_dir=scratch / name / "data", scratch_root=scratch / name / "scratch", pipeline={
        "init_workers": args.workers, "run_slots": args.workers, "postrun_workers": args.workers,
        "sandbox_pool": {"max": pool, "min": pool, "parallel": args.workers, "idle_seconds": 600},
    })  # fmt: skip
    async with GatewayNode(config) as node:
        fill = None
        if pool:
            started = time.monotonic()
            recipe = node.driver.recipe(task)
            node.sandboxes.prewarm(recipe)
            while node.sandboxes.ready(recipe) < pool:
                await asyncio.sleep(0.05)
            fill = time.monotonic() - started
        started = time.monotonic()
        jobs = [await node.submit(task, i) for i in range(args.sessions)]
        results = [await node.pipeline.wait(job.session_id) for job in jobs]
        seconds = time.monotonic() - started
        resets = node.sandboxes.stats.resets_ok
    init = [r.stage_seconds.get("init", 0.0) for r in results]
    names = ("running", "build", "evaluate", "teardown")
    stages = {n: sum(r.stage_seconds.get(n, 0.0) for r in results) / len(results) for n in names}
    return Measurement(name, init, seconds, fill, {r.status for r in results}, resets, stages)


async def bench(args: argparse.Namespace, image: str) -> list[Measurement]:
    def task(reuse: str) -> TaskRequest:
        return swe_task(image, f"bench-{reuse}", FIX, reuse=reuse, prepare_seconds=args.prepare_seconds,
                        max_sessions=args.sessions, bash_agent=args.agent == "bash")  # fmt: skip

    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        return [
            await measure("fresh", task("none"), args, 0, scratch),
            await measure("warm pool", task("none"), args, args.sessions, scratch),
            await measure("pool + reuse", task("reset"), args, args.pool, scratch),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--workers", type=int, default=8, help="INIT workers, run slots and POSTRUN workers")
    parser.add_argument("--pool", type=int, default=8, help="containers of the reuse pool")
    parser.add_argument("--prepare-seconds", type=float, default=2.0)
    parser.add_argument("--agent", choices=("bash", "reference"), default="bash",
                        help="bash: one model call over /dev/tcp; reference: the Node reference agent")  # fmt: skip
    args = parser.parse_args()
    image = build_image(BASE_IMAGE, "polar-bench-swe")
    try:
        measurements = asyncio.run(bench(args, image))
    finally:
        remove_image(image)
    console = Console(width=150)
    table = Table(title=f"{args.sessions} short SWE-like Docker sessions ({args.workers} workers)")
    for column in ("sandboxes", "INIT p50 s", "INIT p95 s", "sessions/min", "vs fresh", "pool fill s", "resets",
                   "run s", "evaluate s", "teardown s", "statuses"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("sandboxes", "statuses") else "right")
    fresh = measurements[0].per_minute
    for m in measurements:
        table.add_row(m.name, f"{m.quantile(0.5):.3f}", f"{m.quantile(0.95):.3f}", f"{m.per_minute:.1f}",
                      f"{m.per_minute / fresh:.2f}x", "-" if m.fill_seconds is None else f"{m.fill_seconds:.1f}",
                      str(m.resets), f"{m.stages['running']:.2f}", f"{m.stages['evaluate']:.2f}",
                      f"{m.stages['teardown']:.2f}", ",".join(sorted(m.statuses)))  # fmt: skip
    console.print(table)
    warm, reuse = measurements[1], measurements[2]
    console.print(f"goals: INIT p50 from a warm pool {warm.quantile(0.5):.3f} s (<= 0.3 s); pool + reuse "
                  f"{reuse.per_minute / fresh:.2f}x the sessions per minute of fresh containers (>= 3x)")  # fmt: skip


if __name__ == "__main__":
    main()
