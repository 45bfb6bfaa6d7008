"""Benchmark: sessions per second through the rollout server with 1, 2, 4 and 8 gateways of fake fast sessions, beside
the server's own dispatch ceiling, so the table shows where the server becomes the limit.

The real server (``polar_cli.server``: SQLite, scheduler, HTTP routes) runs in a child process of its own, and each
simulated gateway in another (``bench/server_scale.py``'s ``ServerProcess``, ``Fleet`` of one ``SimGateway``: a gateway
per process, as on hosts of their own). A simulated gateway runs nothing: it takes each session it is sent and reports
it completed ``--session-ms`` later (``POST /callbacks/session_result``), so a session costs the server its whole
cycle (the task submitted and stored, the session dispatched, the result taken in and stored, the task completed) and
the gateway next to nothing. One gateway can finish at most ``--slots`` sessions per ``--session-ms``: with few
gateways they are the limit, with more the server is. The trainer (this process) submits ``--sessions`` sessions as
tasks of ``--samples``, ``--concurrency`` submits at a time, and the run lasts until the server counts every one
finished.

Per row:

- **sessions/s**: sessions finished over the run's wall time (first submit to the last result stored);
- **server CPU**: the server process's CPU seconds over the run (``/proc/<pid>/stat``, every thread: its event loop and
  its SQLite writer), as a share of one core;
- **server ceiling**: sessions per CPU second of the server, the rate it would sustain if it had a core to itself
  and were never idle: where sessions/s reaches it (server CPU near 100 %), the server is the limit, and more
  gateways add nothing;
- gateways' and trainer's CPU, so a row limited by the machine (every process shares its cores) shows as one.

Checked per row: every task completed, every session finished once (none lost, none sent twice).

    python bench/fleet.py [--gateways 1,2,4,8] [--sessions 4000] [--session-ms 40] [--slots 16] [--samples 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from procs import free_port
from rich.console import Console
from rich.table import Table
from server_scale import Fleet, ServerProcess, make_task

from polar_cli.client import AsyncPolarClient

BUSY = 0.85
"""A server busier than this share of one core is taken to be the limit of its row."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


@dataclass
class Row:
    gateways: int
    sessions: int
    wall_s: float
    server_cpu_s: float
    gateways_cpu_s: float
    trainer_cpu_s: float
    finished: int
    tasks: dict[str, int]
    sent_twice: int

    @property
    def per_s(self) -> float:
        return self.sessions / self.wall_s

    @property
    def ceiling(self) -> float:
        return self.sessions / self.server_cpu_s

    @property
    def server_busy(self) -> float:
        return self.server_cpu_s / self.wall_s


async def one_row(args: argparse.Namespace, gateways: int, token: str) -> Row:
    tasks = -(-args.sessions // args.samples)
    total = tasks * args.samples
    with tempfile.TemporaryDirectory(prefix="polar-fleet-bench-", dir=args.data_dir) as data_dir:
        server = ServerProcess(data_dir, token, args.heartbeat, free_port())
        url = await asyncio.to_thread(server.wait_url)
        fleets = [Fleet(1, args.slots, url, token, args.session_ms / 1000) for _ in range(gateways)]
        try:
            async with AsyncPolarClient(url, token, timeout=300) as client:
                for fleet in fleets:
                    await fleet.started()
                    await fleet.ask("release")  # from now on every session is reported completed as it arrives

                async def finished_count() -> int:
                    return (await client.service_status()).sessions.get("finished", 0)

                async def until_finished(count: int) -> None:
                    deadline = time.monotonic() + args.timeout
                    while await finished_count() < count:
                        if time.monotonic() > deadline:
                            raise SystemExit(f"{gateways} gateways: {count} sessions not finished in {args.timeout} s")
                        await asyncio.sleep(0.05)

                # warm-up: every gateway's first dispatch and the server's first writes, outside the figures
                await client.submit(make_task("warm-up", 2 * gateways))
                await until_finished(2 * gateways)
                before = await finished_count()

                limit = asyncio.Semaphore(args.concurrency)

                async def submit(i: int) -> None:
                    async with limit:
                        await client.submit(make_task(f"fleet-{i}", args.samples))

                fleet_pids = [pid for pid in (fleet.process.pid for fleet in fleets) if pid is not None]
                server0 = cpu_seconds(server.pid)
                gateways0 = sum(cpu_seconds(pid) for pid in fleet_pids)
                trainer0 = time.process_time()
                start = time.perf_counter()
                await asyncio.gather(*(submit(i) for i in range(tasks)))
                await until_finished(before + total)
                wall = time.perf_counter() - start
                server_cpu = cpu_seconds(server.pid) - server0
                gateways_cpu = sum(cpu_seconds(pid) for pid in fleet_pids) - gateways0
                trainer_cpu = time.process_time() - trainer0

                done = await client.service_status()
                sent_twice = 0
                for fleet in fleets:
                    _, again = await fleet.ask("release")
                    sent_twice += again
                    await fleet.ask("close")
        finally:
            for fleet in fleets:
                await asyncio.to_thread(fleet.stop)
            await asyncio.to_thread(server.stop)
    return Row(
        gateways=gateways, sessions=total, wall_s=wall, server_cpu_s=server_cpu, gateways_cpu_s=gateways_cpu,
        trainer_cpu_s=trainer_cpu, finished=done.sessions.get("finished", 0) - before,
        tasks={str(k): v for k, v in done.tasks.items()}, sent_twice=sent_twice,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateways", default="1,2,4,8", help="simulated gateways, one row each")
    parser.add_argument("--sessions", type=int, default=4000, help="sessions per row")
    parser.add_argument("--samples", type=int, default=8, help="sessions per task")
    parser.add_argument("--slots", type=int, default=16, help="run slots of each gateway")
    parser.add_argument("--session-ms", type=float, default=40.0, help="how long a fake session takes at its gateway")
    parser.add_argument("--concurrency", type=int, default=16, help="submits in flight at once")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="the server's heartbeat interval (s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up when a row takes longer (s)")
    parser.add_argument("--data-dir", help="where server.db goes (default: a temporary dir); its fsync speed counts")
    args = parser.parse_args()
    counts = [int(n) for n in args.gateways.split(",") if n.strip()]

    token = secrets.token_urlsafe(16)
    console = Console(width=200)
    rows = []
    for gateways in counts:
        row = asyncio.run(one_row(args, gateways, token))
        rows.append(row)
        console.print(f"{gateways} gateways: {row.per_s:,.0f} sessions/s, server ceiling {row.ceiling:,.0f} "
                      f"sessions/s (server busy {row.server_busy:.0%} of a core)")  # fmt: skip

    table = Table(title=f"sessions through the rollout server ({os.cpu_count()} CPUs, load "
                        f"{os.getloadavg()[0]:.1f}; {args.sessions:,} fake sessions of {args.session_ms:g} ms a row, "
                        f"{args.samples} per task, {args.slots} run slots a gateway)")  # fmt: skip
    columns = ("gateways", "sessions/s", "server ceiling (sessions/s)", "server CPU (of a core)", "server ms / session",
               "gateways CPU", "trainer CPU", "limit", "finished / sent twice", "tasks")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for r in rows:
        limit = "server" if r.server_busy >= BUSY else "not the server"
        table.add_row(str(r.gateways), f"{r.per_s:,.0f}", f"{r.ceiling:,.0f}", f"{r.server_busy:.0%}",
                      f"{1000 * r.server_cpu_s / r.sessions:.2f}", f"{r.gateways_cpu_s / r.wall_s:.0%}",
                      f"{r.trainer_cpu_s / r.wall_s:.0%}", limit, f"{r.finished:,} / {r.sent_twice}",
                      ", ".join(f"{k} {v}" for k, v in r.tasks.items()))  # fmt: skip
    console.print(table)
    console.print(f"limit: 'server' where the server used >= {BUSY:.0%} of a core over the row; its ceiling is "
                  "sessions per second of its own CPU time. CPU shares are of one core; every process shares the "
                  "machine's cores.")  # fmt: skip
    bad = [r for r in rows if r.finished != r.sessions or r.sent_twice or set(r.tasks) - {"completed"}]
    if bad:
        raise SystemExit(f"sessions lost or sent twice in the rows of {[r.gateways for r in bad]} gateways")


if __name__ == "__main__":
    main()
