"""Benchmark: does the staged pipeline keep its run slots busy?

Simulated stage latencies (default INIT 2 s, RUNNING 5 s, POSTRUN 3 s, scaled down by ``--scale``, each drawn uniformly
within +-``--jitter`` of its mean) go through the real StagedPipeline with a driver that only sleeps. Compared with:

- ``one at a time``: each session's INIT, RUNNING and POSTRUN back to back, one session after another;
- ``unstaged``: ``slots`` workers, each holding its slot for a whole session (INIT + RUNNING + POSTRUN), which is how a
  pipeline without separate stage pools behaves.

Little's law bounds any pipeline's throughput by ``run_slots / mean RUNNING time``. The steady-state window runs from
the moment every run slot is first busy to the last session's start of RUNNING (before it the pipeline fills, after
it the work runs out); utilization and throughput are measured in it. Target: >= 95% of the bound.

    python bench/staging.py [--sessions 400] [--slots 8] [--scale 0.02] [--jitter 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from polar_cli.gateway import Built, PipelineConfig, RunOutcome, SessionJob, StagedPipeline
from polar_cli.interfaces.evaluator import EvaluationResult
from polar_cli.models import Completion, Trajectory


@dataclass(frozen=True)
class Latencies:
    init: float
    run: float
    postrun: float
    jitter: float

    def draw(self, rng: random.Random, mean: float) -> float:
        return mean * rng.uniform(1 - self.jitter, 1 + self.jitter)


class SleepDriver:
    """Each stage sleeps its simulated latency; nothing else happens."""

    def __init__(self, latencies: Latencies, seed: int) -> None:
        self.latencies = latencies
        self.rng = random.Random(seed)

    async def init(self, job: SessionJob) -> None:
        await asyncio.sleep(self.latencies.draw(self.rng, self.latencies.init))

    async def run(self, job: SessionJob, deadline: float | None) -> RunOutcome:
        await asyncio.sleep(self.latencies.draw(self.rng, self.latencies.run))
        return RunOutcome("completed")

    async def collect(self, job: SessionJob) -> list[Completion]:
        return []

    async def build(self, job: SessionJob, outcome: RunOutcome, completions: list[Completion]) -> Trajectory:
        return Trajectory(status=outcome.status)

    async def evaluate(
        self, job: SessionJob, outcome: RunOutcome, built: Built, deadline: float | None
    ) -> EvaluationResult:
        await asyncio.sleep(self.latencies.draw(self.rng, self.latencies.postrun))
        return EvaluationResult(reward=1.0)

    async def teardown(self, job: SessionJob, *, immediate: bool) -> None:
        return None


@dataclass
class Measurement:
    name: str
    sessions: int
    seconds: float
    slots: int
    steady_throughput: float | None = None
    steady_utilization: float | None = None
    mean_running: float | None = None

    @property
    def throughput(self) -> float:
        return self.sessions / self.seconds


def steady_state(jobs: list[SessionJob], slots: int) -> tuple[float, float, float]:
    """(throughput, run-slot utilization, mean RUNNING seconds) in the steady-state window."""
    spans = sorted((j.marks["run_started"], j.marks["run_finished"]) for j in jobs)
    start, end = spans[slots - 1][0], spans[-1][0]
    if end <= start:
        raise SystemExit("too few sessions for a steady state: raise --sessions")
    busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    finished = sum(1 for _, b in spans if start < b <= end)
    mean_running = statistics.fmean(b - a for a, b in spans)
    return finished / (end - start), busy / (slots * (end - start)), mean_running


async def staged(args: argparse.Namespace, latencies: Latencies) -> Measurement:
    config = PipelineConfig(
        init_workers=args.init_workers,
        ready_capacity=args.ready,
        run_slots=args.slots,
        postrun_workers=args.postrun_workers,
    )
    async with StagedPipeline(SleepDriver(latencies, args.seed), config) as pipeline:
        began = time.monotonic()
        jobs = [await pipeline.submit(SessionJob(f"s{i}")) for i in range(args.sessions)]
        for job in jobs:
            await pipeline.wait(job.session_id)
        seconds = time.monotonic() - began
    throughput, utilization, mean_running = steady_state(jobs, args.slots)
    return Measurement("staged pipeline", args.sessions, seconds, args.slots, throughput, utilization, mean_running)


async def unstaged(args: argparse.Namespace, latencies: Latencies, concurrency: int, sessions: int) -> Measurement:
    """``concurrency`` workers, each running whole sessions (a slot is held through INIT and POSTRUN too)."""
    driver = SleepDriver(latencies, args.seed)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(sessions):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            job = SessionJob(f"u{queue.get_nowait()}")
            await driver.init(job)
            outcome = await driver.run(job, None)
            built = Built(await driver.build(job, outcome, await driver.collect(job)))
            await driver.evaluate(job, outcome, built, None)

    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    name = "one at a time" if concurrency == 1 else f"unstaged ({concurrency} workers)"
    return Measurement(name, sessions, time.monotonic() - began, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--baseline-sessions", type=int, default=20, help="sessions for the one-at-a-time baseline")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--init", type=float, default=2.0, help="mean INIT seconds (before scaling)")
    parser.add_argument("--run", type=float, default=5.0, help="mean RUNNING seconds (before scaling)")
    parser.add_argument("--postrun", type=float, default=3.0, help="mean POSTRUN seconds (before scaling)")
    parser.add_argument("--scale", type=float, default=0.02, help="multiply every latency by this")
    parser.add_argument("--jitter", type=float, default=0.5, help="latencies uniform within +-jitter of the mean")
    parser.add_argument("--init-workers", type=int, default=None, help="default: what Little's law asks, x1.5")
    parser.add_argument("--postrun-workers", type=int, default=None, help="default: what Little's law asks, x1.5")
    parser.add_argument("--ready", type=int, default=None, help="READY buffer (default: --slots)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    latencies = Latencies(args.init * args.scale, args.run * args.scale, args.postrun * args.scale, args.jitter)
    # a stage keeps up when its workers / its latency >= slots / RUNNING latency (Little's law), plus headroom
    args.init_workers = args.init_workers or math.ceil(1.5 * args.slots * args.init / args.run)
    args.postrun_workers = args.postrun_workers or math.ceil(1.5 * args.slots * args.postrun / args.run)
    args.ready = args.ready or args.slots

    async def measure() -> list[Measurement]:
        return [
            await staged(args, latencies),
            await unstaged(args, latencies, args.slots, args.sessions),
            await unstaged(args, latencies, 1, args.baseline_sessions),
        ]

    results = asyncio.run(measure())
    pipeline = results[0]
    assert pipeline.mean_running is not None and pipeline.steady_throughput is not None
    bound = args.slots / pipeline.mean_running

    console = Console(width=150)
    console.print(
        f"latencies (mean s): INIT {latencies.init:g}, RUNNING {latencies.run:g}, POSTRUN {latencies.postrun:g}, "
        f"jitter +-{args.jitter:.0%}; run slots {args.slots}, INIT workers {args.init_workers}, READY "
        f"{args.ready}, POSTRUN workers {args.postrun_workers}"
    )
    table = Table(title="run-slot utilization and throughput")
    for column in ("mode", "sessions", "wall s", "sessions/s", "x one-at-a-time", "steady sessions/s",
                   "steady slot utilization", "% of Little bound"):  # fmt: skip
        table.add_column(column, justify="right" if column != "mode" else "left")
    serial = results[-1].throughput
    for m in results:
        steady = m.steady_throughput
        table.add_row(
            m.name,
            str(m.sessions),
            f"{m.seconds:.2f}",
            f"{m.throughput:.2f}",
            f"{m.throughput / serial:.1f}",
            f"{steady:.2f}" if steady is not None else "-",
            f"{m.steady_utilization:.1%}" if m.steady_utilization is not None else "-",
            f"{steady / bound:.1%}" if steady is not None else f"{m.throughput / bound:.1%}",
        )
    console.print(table)
    verdict = "meets" if pipeline.steady_throughput >= 0.95 * bound else "MISSES"
    console.print(
        f"Little's law bound: {args.slots} slots / {pipeline.mean_running:.4f} s mean RUNNING = {bound:.2f} sessions/s;"
        f" the staged pipeline's steady state reaches {pipeline.steady_throughput / bound:.1%} ({verdict} the 95% "
        f"target); over the whole run, including fill and drain: {pipeline.throughput / bound:.1%}."
    )


if __name__ == "__main__":
    main()
