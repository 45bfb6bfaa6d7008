"""Benchmark: the rollout server with 10,000 sessions in flight at once on simulated gateways.

The real server (``polar_cli.server``: SQLite, scheduler, HTTP routes) runs in a child process of its own, so its RSS
is read cleanly from ``/proc/<pid>/status``. This process runs the simulated gateway nodes and the trainer:

- each simulated gateway is a small aiohttp app speaking the node side of docs/service.md: it registers (``POST
  /nodes/register``), heartbeats its load and held sessions, accepts ``POST /sessions`` (201) and ``POST
  /sessions/batch`` (each session accepted), answers ``GET /sessions/{id}`` for the sessions it holds and, when told
  to, calls back ``POST /callbacks/session_result`` with a small SessionResult. No harness, runtime or proxy runs;
- the trainer submits through ``AsyncPolarClient``.

Phases:

1. **idle dispatch**: single-session tasks submitted one after another, each waited for at a gateway before the next:
   the latency of one dispatch with nothing queued (submit sent → the gateway receiving ``POST /sessions``);
2. **burst**: ``--tasks`` tasks of ``--samples`` sessions submitted ``--concurrency`` at a time. The gateways hold every
   session (their run slots add up to the burst) until all of them have arrived, so that many are in flight at once;
   then they call back. Measured: submit throughput, dispatch latency under load, dispatch cost per session (the span
   from the first submit to the last session's arrival, divided by the sessions), callback throughput, server RSS.

Targets: dispatch under 1 ms per session, server RSS under 1 GB.

    python bench/server_scale.py [--tasks 1000] [--samples 10] [--nodes 20] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.table import Table

from polar_cli.client import AsyncPolarClient
from polar_cli.models import SessionResult, TaskRequest, Trajectory
from polar_cli.node_protocol import SessionBatch
from polar_cli.web.auth import guarded
from polar_cli.web.errors import json_response

# ---- the server, in a child process -----------------------------------------------------------------------------


def _serve_child(data_dir: str, token: str, heartbeat_s: float, conn: Connection) -> None:
    """Child process: ``polar serve --role server`` through its Python API (``polar_cli.launch.serve``) on a
    free port; sends the URL, serves until the pipe closes."""
    from polar_cli.launch import ServeConfig, serve
    from polar_cli.server.config import ServerConfig

    server = ServerConfig(
        port=0, data_dir=Path(data_dir), token=token, heartbeat_interval_s=heartbeat_s,
        dead_after_intervals=20,  # a bench process busy with 10,000 sessions may heartbeat late: no false deaths
        reservations_per_node=1_000_000, max_queued_per_node=0, dispatch_timeout_s=120,
    )  # fmt: skip

    async def main() -> None:
        config = ServeConfig(role="server", server=server)
        serving = asyncio.create_task(serve(config, lambda info: conn.send(info.url)))
        closed = asyncio.get_running_loop().run_in_executor(None, _wait_closed, conn)
        await asyncio.wait([serving, closed], return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving

    asyncio.run(main())


def _wait_closed(conn: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of ``pid`` in MiB: psutil when installed, else /proc/<pid>/status."""
    try:
        import psutil

        info = psutil.Process(pid).memory_info()
        peak = getattr(info, "peak_wset", None) or _proc_status_kib(pid, "VmHWM") * 1024
        return info.rss / 2**20, peak / 2**20
    except ImportError:
        return _proc_status_kib(pid, "VmRSS") / 1024, _proc_status_kib(pid, "VmHWM") / 1024


def _proc_status_kib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return float(line.split()[1])
    return 0.0


# ---- simulated gateways -----------------------------------------------------------------------------------------


@dataclass
class Arrivals:
    """When each session reached a gateway (``time.perf_counter``), shared by every simulated node."""

    at: dict[str, float] = field(default_factory=dict)
    task_of: dict[str, str] = field(default_factory=dict)
    target: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    peak_in_flight: int = 0
    in_flight: int = 0

    def arrived(self, session_id: str, task_id: str) -> None:
        if session_id in self.at:
            return  # a re-dispatch: the first arrival counts
        self.at[session_id] = time.perf_counter()
        self.task_of[session_id] = task_id
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        if self.target and len(self.at) >= self.target:
            self.reached.set()


class SimGateway:
    """A gateway node that runs nothing: it holds each session until released, then reports it completed."""

    def __init__(
        self, name: str, run_slots: int, arrivals: Arrivals, http: aiohttp.ClientSession, limit: asyncio.Semaphore
    ) -> None:
        self.name = name
        self.callback_limit = limit  # callbacks in flight from all simulated gateways together
        self.run_slots = run_slots
        self.arrivals = arrivals
        self.http = http
        self.token = secrets.token_urlsafe(16)
        self.held: dict[str, tuple[str, int, int]] = {}  # session_id -> (task_id, sample_index, attempt)
        self.hold = True
        self.released = asyncio.Event()
        self.node_id = ""
        self.url = ""
        self.server_url = ""
        self.callbacks_sent = 0
        self.runner: web.AppRunner | None = None
        self.heartbeat: asyncio.Task[None] | None = None
        self.drains: set[asyncio.Task[None]] = set()

    async def start(self, server_url: str, server_token: str) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/sessions", guarded(self.token, self.name, self._create))
        app.router.add_post("/sessions/batch", guarded(self.token, self.name, self._create_batch))
        app.router.add_get("/sessions/{session_id}", guarded(self.token, self.name, self._get))
        app.router.add_get("/healthz", self._health)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.server_url = server_url
        body = {"url": self.url, "token": self.token, "capacity": {"run_slots": self.run_slots}, "held_results": []}
        answer = await self._post("/nodes/register", body, server_token)
        self.node_id = answer["node_id"]
        self.heartbeat = asyncio.create_task(self._heartbeats(float(answer["heartbeat_interval_s"])))

    async def _post(self, path: str, body: Any, token: str) -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        async with self.http.post(self.server_url + path, json=body, headers=headers) as response:
            if response.status >= 400:
                raise RuntimeError(f"{self.name}: POST {path}: {response.status} {await response.text()}")
            return await response.json()

    async def _heartbeats(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            running = len(self.held)
            free = max(0, self.run_slots - running)
            load = {"run_slots": self.run_slots, "running": min(running, self.run_slots),
                    "queued": max(0, running - self.run_slots), "free_slots": free}  # fmt: skip
            with contextlib.suppress(aiohttp.ClientError, RuntimeError):
                await self._post(f"/nodes/{self.node_id}/heartbeat", {"load": load, "sessions": list(self.held)},
                                 self.token)  # fmt: skip

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        task = body["task"]
        session_id, sample_index = body["session_id"], int(body.get("sample_index", 0))
        attempt = int((task.get("metadata") or {}).get("polar_attempt", body.get("attempt", 1)))
        self._take(session_id, task["task_id"], sample_index, attempt)
        answer = {"session_id": session_id, "task_id": task["task_id"], "sample_index": sample_index, "stage": "init"}
        return json_response(answer, 201)

    async def _create_batch(self, request: web.Request) -> web.Response:
        """``POST /sessions/batch`` as a real gateway answers it: each task once, one answer per session."""
        batch = SessionBatch.model_validate_json(await request.read())
        answers = []
        for spec in batch.sessions:
            if spec.task_id not in batch.tasks:
                answers.append({"session_id": spec.session_id, "accepted": False, "status": 400,
                                "error": f"task {spec.task_id!r} is not in the batch"})  # fmt: skip
                continue
            self._take(spec.session_id, spec.task_id, spec.sample_index, spec.attempt or 1)
            answers.append({"session_id": spec.session_id, "accepted": True, "status": 201})
        return json_response({"sessions": answers})

    def _take(self, session_id: str, task_id: str, sample_index: int, attempt: int) -> None:
        self.arrivals.arrived(session_id, task_id)
        self.held[session_id] = (task_id, sample_index, attempt)
        if not self.hold:
            self._finish_later(session_id)

    async def _get(self, request: web.Request) -> web.Response:
        """``GET /sessions/{id}``: the server's reconciliation asks about a session a heartbeat did not list yet."""
        session_id = request.match_info["session_id"]
        if session_id not in self.held:
            return json_response({"error": {"message": f"unknown session {session_id!r}", "type": "not_found"}}, 404)
        return json_response({"session_id": session_id, "stage": "run"})

    async def _health(self, request: web.Request) -> web.Response:
        return json_response({"ok": True, "sessions": len(self.held)})

    def release(self) -> None:
        """Stop holding: call back every held session (and each later one at once)."""
        self.hold = False
        for session_id in list(self.held):
            self._finish_later(session_id)

    def _finish_later(self, session_id: str) -> None:
        task = asyncio.create_task(self._callback(session_id))
        self.drains.add(task)
        task.add_done_callback(self.drains.discard)

    async def _callback(self, session_id: str) -> None:
        task_id, sample_index, attempt = self.held[session_id]
        result = SessionResult(
            session_id=session_id, task_id=task_id, sample_index=sample_index, status="completed", reward=1.0,
            trajectory=Trajectory(session_id=session_id, status="completed", reward=1.0),
            metadata={"polar_attempt": attempt},
        )  # fmt: skip
        body = {"node_id": self.node_id, "session_id": session_id, "attempt": attempt,
                "result": result.model_dump(mode="json")}  # fmt: skip
        async with self.callback_limit:
            for delay in (0.0, 0.5, 1.0, 2.0, 4.0):
                await asyncio.sleep(delay)
                with contextlib.suppress(aiohttp.ClientError, RuntimeError):
                    await self._post("/callbacks/session_result", body, self.token)
                    break
        self.held.pop(session_id, None)
        self.arrivals.in_flight -= 1
        self.callbacks_sent += 1

    async def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
            await asyncio.gather(self.heartbeat, return_exceptions=True)
        for task in list(self.drains):
            task.cancel()
        if self.runner is not None:
            await self.runner.cleanup()


# ---- the benchmark ----------------------------------------------------------------------------------------------


def make_task(task_id: str, samples: int) -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="simulated", num_samples=samples,
                       agent={"harness": "shell", "config": {"command": "true"}},
                       builder={"strategy": "per_request"})  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


@dataclass
class Figures:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, what: str, value: str, target: str = "") -> None:
        self.rows.append((what, value, target))


async def run_bench(args: argparse.Namespace, url: str, token: str, server_pid: int) -> Figures:
    figures = Figures()
    total = args.tasks * args.samples
    arrivals = Arrivals()
    slots = -(-max(total, args.idle) // args.nodes)
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as http, AsyncPolarClient(url, token, timeout=120) as client:
        callbacks = asyncio.Semaphore(64)
        nodes = [SimGateway(f"sim-{i}", slots, arrivals, http, callbacks) for i in range(args.nodes)]
        await asyncio.gather(*(node.start(url, token) for node in nodes))
        baseline = rss_mib(server_pid)[0]

        # 1. idle dispatch: one single-session task at a time
        idle: list[float] = []
        for node in nodes:
            node.hold = False
        for i in range(args.idle):
            arrivals.reached.clear()
            arrivals.target = len(arrivals.at) + 1
            start = time.perf_counter()
            await client.submit(make_task(f"idle-{i}", 1))
            await asyncio.wait_for(arrivals.reached.wait(), 60)
            idle.append((arrivals.at[max(arrivals.at, key=arrivals.at.__getitem__)] - start) * 1000)
        while any(node.held for node in nodes):
            await asyncio.sleep(0.01)
        figures.add("idle dispatch latency p50 / p99", f"{percentile(idle, 0.5):.2f} / {percentile(idle, 0.99):.2f} ms",
                    f"{args.idle} single-session tasks, one at a time")  # fmt: skip

        # 2. burst: every session held at its gateway until all have arrived
        for node in nodes:
            node.hold = True
        arrivals.reached.clear()
        arrivals.target = len(arrivals.at) + total
        arrivals.peak_in_flight = arrivals.in_flight
        submitted_at: dict[str, float] = {}
        limit = asyncio.Semaphore(args.concurrency)

        async def submit(i: int) -> None:
            task = make_task(f"burst-{i}", args.samples)
            async with limit:
                submitted_at[task.task_id] = time.perf_counter()
                await client.submit(task)

        first = time.perf_counter()
        await asyncio.gather(*(submit(i) for i in range(args.tasks)))
        submit_s = time.perf_counter() - first
        await asyncio.wait_for(arrivals.reached.wait(), args.timeout)
        burst = [s for s, task_id in arrivals.task_of.items() if task_id.startswith("burst-")]
        last = max(arrivals.at[s] for s in burst)
        latencies = [(arrivals.at[s] - submitted_at[arrivals.task_of[s]]) * 1000 for s in burst]
        rss_now, _ = rss_mib(server_pid)
        overview = await client.service_status()

        released = time.perf_counter()
        for node in nodes:
            node.release()
        while any(node.held for node in nodes):
            await asyncio.sleep(0.05)
        callback_s = time.perf_counter() - released
        done = await client.service_status()
        rss_peak = rss_mib(server_pid)[1]
        await asyncio.gather(*(node.close() for node in nodes))

    figures.add("burst", f"{args.tasks} tasks x {args.samples} samples = {total} sessions",
                f"{args.nodes} simulated gateways x {slots} run slots")  # fmt: skip
    figures.add("submit throughput", f"{args.tasks / submit_s:,.0f} tasks/s = {total / submit_s:,.0f} sessions/s",
                f"{args.concurrency} submits in flight")  # fmt: skip
    per_session = (last - first) * 1000 / total
    figures.add("dispatch cost per session", f"{per_session:.3f} ms ({total / (last - first):,.0f} sessions/s)",
                "target < 1 ms: " + ("met" if per_session < 1 else "MISSED"))  # fmt: skip
    figures.add("dispatch latency p50 / p99 (burst)",
                f"{percentile(latencies, 0.5):,.1f} / {percentile(latencies, 0.99):,.1f} ms",
                "submit sent -> gateway got POST /sessions, queueing included")  # fmt: skip
    figures.add("sessions in flight at once", f"{arrivals.peak_in_flight:,}",
                f"server: {overview.pending_sessions} pending, tasks {dict(overview.tasks)}")  # fmt: skip
    figures.add("callbacks committed", f"{total / callback_s:,.0f} results/s", f"tasks now {dict(done.tasks)}")
    rss_ok = "met" if rss_peak < 1024 else "MISSED"
    figures.add("server RSS", f"{rss_now:,.0f} MiB with all in flight; peak {rss_peak:,.0f} MiB",
                f"at start {baseline:,.0f} MiB; target < 1 GB: {rss_ok}")  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32, help="submits in flight at once")
    parser.add_argument("--idle", type=int, default=200, help="single-session tasks for the idle dispatch latency")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="the server's heartbeat interval (s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up when the burst takes longer (s)")
    parser.add_argument("--data-dir", help="where server.db goes (default: a temporary dir); its fsync speed counts")
    args = parser.parse_args()

    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="polar-server-bench-", dir=args.data_dir) as data_dir:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        server = ctx.Process(target=_serve_child, args=(data_dir, token, args.heartbeat, child), daemon=True)
        server.start()
        try:
            if not parent.poll(60):
                raise SystemExit("the server did not start within 60 s")
            url = parent.recv()
            assert server.pid is not None
            figures = asyncio.run(run_bench(args, url, token, server.pid))
        finally:
            parent.close()
            server.join(30)
            if server.is_alive():
                server.kill()
        db = Path(data_dir) / "server.db"
        db_mib = sum(p.stat().st_size for p in db.parent.glob("server.db*")) / 2**20
    table = Table(title=f"rollout server at scale ({os.cpu_count()} CPUs)")
    for column in ("what", "measured", "notes"):
        table.add_column(column)
    for row in figures.rows:
        table.add_row(*row)
    table.add_row("database", f"{db_mib:,.1f} MiB", "server.db with its WAL, after the run")
    Console().print(table)


if __name__ == "__main__":
    main()
