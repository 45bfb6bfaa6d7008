"""Benchmark: the rollout server with 10,000, 30,000 and 100,000 sessions in flight at once on simulated gateways.

The real server (``polar_cli.server``: SQLite, scheduler, HTTP routes) runs in a child process of its own, so its RSS
is read cleanly from ``/proc/<pid>/status`` and it can be killed with SIGKILL. The simulated gateway nodes run in a
second child process (``Fleet``) and the trainer in this one, so the server's figures are the server's: with the
gateways in the trainer's process (as before), 20 gateways' event-loop time and the submissions' shared one loop, and on
a small machine the figures measured that loop as much as the server. The three processes still share the machine's
cores: on 2 cores the server gets about one.

- each simulated gateway is a small aiohttp app speaking the node side of docs/service.md: it registers (``POST
  /nodes/register``), heartbeats its load and held sessions, accepts ``POST /sessions`` (201) and ``POST
  /sessions/batch`` (each session accepted), answers ``GET /sessions/{id}`` for the sessions it holds and, when told
  to, calls back ``POST /callbacks/session_result`` with a small SessionResult. No harness, runtime or proxy runs;
- the trainer submits through ``AsyncPolarClient``.

For each size (``--sizes``), first the dispatch figure's ceiling, **submission alone**: the same burst submitted the
same way to a server of its own with no gateway, so nothing is dispatched (milliseconds per session; dispatch adds
the difference: on a 2-core machine the trainer's submissions and the server's intake of them already take most of
what the dispatch figure spans). Then, on a fresh server and database:

1. **burst**: ``size / --samples`` tasks submitted ``--concurrency`` at a time. The gateways hold every session (their
   run slots add up to the burst) until all of them have arrived, so that many are in flight at once. Measured:
   dispatch cost per session (the span from the first submit to the last session's arrival, divided by the
   sessions), the sessions per dispatch call the gateways received (the server's batching: each call costs its event
   loop about the same, however few sessions it carries), submission-to-dispatch latency p50/p99 (submit sent ->
   the gateway receiving the session), and ``GET /rollout/status`` latency while the burst is under way;
2. **in flight**: ``GET /rollout/status`` and a task's ``GET /rollout/task/{id}`` latency, the server's RSS;
3. **kill -9**: the server is killed with SIGKILL and started again on its data dir and port. Measured: the time
   from the kill until the new server answers with every session still in flight (none lost, none pending again),
   and until its reconciliation has confirmed each of them with its gateway;
4. **drain**: the gateways call back every session; checked: every task completed, no session lost, none sent to a
   gateway twice (run twice), each reported once.

Before the first size, ``--idle`` single-session tasks measure one dispatch with nothing queued.

Targets at 100,000 in flight: dispatch <= 0.2 ms per session, submission-to-dispatch p99 <= 1 s, server RSS < 1 GB.

    python bench/server_scale.py [--sizes 10000,30000,100000] [--samples 10] [--nodes 20] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from procs import free_port
from rich.console import Console
from rich.table import Table

from polar_cli.client import AsyncPolarClient
from polar_cli.models import SessionResult, TaskRequest, Trajectory
from polar_cli.node_protocol import SessionBatch
from polar_cli.web.auth import guarded
from polar_cli.web.errors import json_response

# ---- the server, in a child process -----------------------------------------------------------------------------


def _serve_child(data_dir: str, token: str, heartbeat_s: float, port: int, profile: str, conn: Connection) -> None:
    """Child process: ``polar serve --role server`` through its Python API (``polar_cli.launch.serve``) on ``port``;
    sends the URL, serves until the pipe closes. With ``profile``, cProfile statistics are written there at exit."""
    from polar_cli.launch import ServeConfig, serve
    from polar_cli.server.config import ServerConfig

    server = ServerConfig(
        port=port, data_dir=Path(data_dir), token=token, heartbeat_interval_s=heartbeat_s,
        dead_after_intervals=20,  # a bench process busy with 100,000 sessions may heartbeat late: no false deaths
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

    if not profile:
        asyncio.run(main())
        return
    import cProfile

    profiler = cProfile.Profile()  # the event loop's thread; written at SIGUSR1 (before the kill -9)
    signal.signal(signal.SIGUSR1, lambda *_: profiler.dump_stats(profile))
    profiler.runcall(asyncio.run, main())


def _wait_closed(conn: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


class ServerProcess:
    """The server in its child process, on a fixed port (a restart after ``kill -9`` comes back at the same URL)."""

    def __init__(self, data_dir: str, token: str, heartbeat_s: float, port: int, profile: str = "") -> None:
        ctx = multiprocessing.get_context("spawn")
        self.parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve_child, args=(data_dir, token, heartbeat_s, port, profile, child),
                                   daemon=True)  # fmt: skip
        self.process.start()
        child.close()

    def wait_url(self) -> str:
        """Blocking: the URL once the server listens."""
        if not self.parent.poll(120):
            raise SystemExit("the server did not start within 120 s")
        return str(self.parent.recv())

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def kill9(self) -> None:
        self.process.kill()  # SIGKILL: no shutdown, no flush, whatever was under way is cut
        self.process.join(30)
        self.parent.close()

    def stop(self) -> None:
        self.parent.close()  # the child serves until its pipe closes, then stops cleanly
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(30)


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
    again: int = 0
    """Sessions that reached a gateway a second time: sent again, so run twice."""
    reported: int = 0
    """Results the server acknowledged."""
    looked_up: int = 0
    """``GET /sessions/{id}`` the server made (its reconciliation)."""
    calls: int = 0
    """``POST /sessions`` and ``POST /sessions/batch`` calls the server made (sessions per call: its batching)."""

    def arrived(self, session_id: str, task_id: str) -> None:
        if session_id in self.at:
            self.again += 1
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
        self,
        name: str,
        run_slots: int,
        arrivals: Arrivals,
        http: aiohttp.ClientSession,
        limit: asyncio.Semaphore,
        session_s: float = 0.0,
    ) -> None:
        self.name = name
        self.session_s = session_s  # once released, how long a session takes before it is reported (bench/fleet.py)
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
        self.arrivals.calls += 1
        body = await request.json()
        task = body["task"]
        session_id, sample_index = body["session_id"], int(body.get("sample_index", 0))
        attempt = int((task.get("metadata") or {}).get("polar_attempt", body.get("attempt", 1)))
        self._take(session_id, task["task_id"], sample_index, attempt)
        answer = {"session_id": session_id, "task_id": task["task_id"], "sample_index": sample_index, "stage": "init"}
        return json_response(answer, 201)

    async def _create_batch(self, request: web.Request) -> web.Response:
        """``POST /sessions/batch`` as a real gateway answers it: each task once, one answer per session."""
        self.arrivals.calls += 1
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
        self.arrivals.looked_up += 1
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
        if self.session_s:
            await asyncio.sleep(self.session_s)
        async with self.callback_limit:
            for delay in (0.0, 0.5, 1.0, 2.0, 4.0):
                await asyncio.sleep(delay)
                with contextlib.suppress(aiohttp.ClientError, RuntimeError):
                    await self._post("/callbacks/session_result", body, self.token)
                    self.arrivals.reported += 1
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


# ---- the simulated gateways, in a process of their own ---------------------------------------------------------


@dataclass
class Burst:
    """What the fleet's process reports once every session of a burst has arrived."""

    at: dict[str, float]
    task_of: dict[str, str]
    calls: int
    """The server's calls that brought them."""


def _fleet_child(nodes: int, slots: int, url: str, token: str, conn: Connection, session_s: float = 0.0) -> None:
    """Child process: ``nodes`` simulated gateways of ``slots`` run slots each, registered at ``url``; does what the
    parent asks over ``conn`` (``Fleet``) until it asks ``close``."""
    asyncio.run(_fleet_main(nodes, slots, url, token, conn, session_s))


async def _fleet_main(count: int, slots: int, url: str, token: str, conn: Connection, session_s: float) -> None:
    arrivals = Arrivals()
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as http:
        callbacks = asyncio.Semaphore(64)
        nodes = [SimGateway(f"sim-{i}", slots, arrivals, http, callbacks, session_s) for i in range(count)]
        await asyncio.gather(*(node.start(url, token) for node in nodes))
        conn.send("started")
        while True:
            command, arg = await loop.run_in_executor(None, conn.recv)
            if command == "burst":  # every session of the burst arrived: when each did
                arrivals.target = arg
                await arrivals.reached.wait()
                conn.send(Burst(at=arrivals.at, task_of=arrivals.task_of, calls=arrivals.calls))
            elif command == "looked_up":
                conn.send(arrivals.looked_up)
            elif command == "release":  # every session called back
                for node in nodes:
                    node.release()
                while any(node.held for node in nodes):
                    await asyncio.sleep(0.05)
                conn.send((arrivals.peak_in_flight, arrivals.again))
            elif command == "close":
                await asyncio.gather(*(node.close() for node in nodes))
                conn.send("closed")
                return


class Fleet:
    """The simulated gateways in a child process: the server is measured apart from them (in the trainer's process
    too they took the same cores' event-loop time as the submissions, and the figures were theirs as much as the
    server's). Arrival times are ``time.perf_counter`` there, the same monotonic clock as here."""

    def __init__(self, nodes: int, slots: int, url: str, token: str, session_s: float = 0.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_fleet_child, args=(nodes, slots, url, token, child, session_s),
                                   daemon=True)  # fmt: skip
        self.process.start()
        child.close()

    async def ask(self, command: str, arg: Any = None, timeout: float = 120.0) -> Any:
        self.parent.send((command, arg))
        if not await asyncio.to_thread(self.parent.poll, timeout):
            raise SystemExit(f"the simulated gateways did not answer {command!r} within {timeout:.0f} s")
        return self.parent.recv()

    async def started(self) -> None:
        if not await asyncio.to_thread(self.parent.poll, 120):
            raise SystemExit("the simulated gateways did not start within 120 s")
        self.parent.recv()

    def stop(self) -> None:
        self.parent.close()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(30)


# ---- the benchmark ----------------------------------------------------------------------------------------------


def make_task(task_id: str, samples: int) -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="simulated", num_samples=samples,
                       agent={"harness": "shell", "config": {"command": "true"}},
                       builder={"strategy": "per_request"})  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


@dataclass
class SizeRow:
    """One size's figures (milliseconds unless named otherwise)."""

    in_flight: int
    per_session_ms: float
    p50_ms: float
    p99_ms: float
    status_busy_ms: tuple[float, float]
    status_ms: tuple[float, float]
    task_status_ms: tuple[float, float]
    rss_mib: float
    peak_rss_mib: float
    serving_s: float
    reconciled_s: float
    looked_up: int
    burst_look_ups: int
    sessions_per_call: float
    """Sessions per dispatch call the gateways received during the burst."""
    lost: int
    run_twice: int
    results_per_s: float
    tasks: dict[str, int]


async def timed(probe: Any, times: int) -> tuple[float, float]:
    """(p50, max) milliseconds of ``times`` calls of ``probe()``."""
    spans = []
    for _ in range(times):
        start = time.perf_counter()
        await probe()
        spans.append((time.perf_counter() - start) * 1000)
    return percentile(spans, 0.5), max(spans)


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def idle_dispatch(args: argparse.Namespace, token: str) -> tuple[float, float]:
    """p50/p99 of one dispatch with nothing queued (a server of its own, one gateway)."""
    with tempfile.TemporaryDirectory(prefix="polar-server-bench-", dir=args.data_dir) as data_dir:
        server = ServerProcess(data_dir, token, args.heartbeat, free_port())
        url = await asyncio.to_thread(server.wait_url)
        arrivals = Arrivals()
        try:
            async with aiohttp.ClientSession() as http, AsyncPolarClient(url, token, timeout=120) as client:
                node = SimGateway("sim-idle", 8, arrivals, http, asyncio.Semaphore(8))
                await node.start(url, token)
                node.hold = False
                spans: list[float] = []
                for i in range(args.idle):
                    arrivals.reached.clear()
                    arrivals.target = len(arrivals.at) + 1
                    start = time.perf_counter()
                    await client.submit(make_task(f"idle-{i}", 1))
                    await asyncio.wait_for(arrivals.reached.wait(), 60)
                    spans.append((max(arrivals.at.values()) - start) * 1000)
                while node.held:
                    await asyncio.sleep(0.01)
                await node.close()
        finally:
            await asyncio.to_thread(server.stop)
    return percentile(spans, 0.5), percentile(spans, 0.99)


async def submit_only(args: argparse.Namespace, size: int, token: str) -> float:
    """The ceiling of the dispatch figure: milliseconds per session to submit the same burst, the same way, to a server
    of its own with no gateway registered (its sessions stay pending: nothing is dispatched). The dispatch figure spans
    the same submissions plus dispatch, so what dispatch adds is the difference."""
    tasks = -(-size // args.samples)
    with tempfile.TemporaryDirectory(prefix="polar-server-bench-", dir=args.data_dir) as data_dir:
        server = ServerProcess(data_dir, token, args.heartbeat, free_port())
        url = await asyncio.to_thread(server.wait_url)
        try:
            async with AsyncPolarClient(url, token, timeout=300) as client:
                limit = asyncio.Semaphore(args.concurrency)

                async def submit(i: int) -> None:
                    async with limit:
                        await client.submit(make_task(f"burst-{i}", args.samples))

                first = time.perf_counter()
                await asyncio.gather(*(submit(i) for i in range(tasks)))
                return (time.perf_counter() - first) * 1000 / (tasks * args.samples)
        finally:
            await asyncio.to_thread(server.stop)


async def one_size(args: argparse.Namespace, size: int, token: str) -> SizeRow:
    tasks = -(-size // args.samples)
    total = tasks * args.samples
    slots = -(-total // args.nodes)
    port = free_port()
    profile = f"{args.profile}.{size}" if args.profile else ""
    with tempfile.TemporaryDirectory(prefix="polar-server-bench-", dir=args.data_dir) as data_dir:
        server = ServerProcess(data_dir, token, args.heartbeat, port, profile)
        url = await asyncio.to_thread(server.wait_url)
        fleet = Fleet(args.nodes, slots, url, token)
        try:
            async with AsyncPolarClient(url, token, timeout=300) as client:
                await fleet.started()

                # 1. burst: every session held at its gateway until all have arrived; the status probed meanwhile
                arrived = asyncio.create_task(fleet.ask("burst", total, args.timeout))
                submitted_at: dict[str, float] = {}
                limit = asyncio.Semaphore(args.concurrency)

                async def submit(i: int) -> None:
                    task = make_task(f"burst-{i}", args.samples)
                    async with limit:
                        submitted_at[task.task_id] = time.perf_counter()
                        await client.submit(task)

                busy: list[float] = []

                async def probe_status() -> None:
                    while not arrived.done():
                        start = time.perf_counter()
                        await client.service_status()
                        busy.append((time.perf_counter() - start) * 1000)
                        await asyncio.sleep(0.2)

                prober = asyncio.create_task(probe_status())
                first = time.perf_counter()
                await asyncio.gather(*(submit(i) for i in range(tasks)))
                burst: Burst = await arrived
                await prober
                last = max(burst.at.values())
                latencies = [(at - submitted_at[burst.task_of[s]]) * 1000 for s, at in burst.at.items()]

                # 2. all in flight: status latencies, memory
                status_ms = await timed(client.service_status, 20)
                task_ids = [f"burst-{i}" for i in range(0, tasks, max(1, tasks // 20))]
                picks = iter(task_ids * 2)
                task_status_ms = await timed(lambda: client.status(next(picks)), len(task_ids))
                rss_now = rss_mib(server.pid)[0]
                peak = rss_mib(server.pid)[1]

                # 3. kill -9 with everything in flight, restart on the same data dir and port
                if profile:
                    os.kill(server.pid, signal.SIGUSR1)
                    await until(lambda: asyncio.sleep(0.5, Path(profile).exists()), 60, "the server's profile")
                looked_up = burst_look_ups = await fleet.ask("looked_up")
                killed = time.perf_counter()
                server.kill9()
                server = ServerProcess(data_dir, token, args.heartbeat, port, "")
                await asyncio.to_thread(server.wait_url)
                restarted = time.time()

                async def all_in_flight() -> bool:
                    counts = (await client.service_status()).sessions
                    in_flight = counts.get("dispatched", 0) + counts.get("running", 0)
                    if counts.get("pending", 0) or counts.get("finished", 0):
                        raise SystemExit(f"after kill -9: {counts} (expected all {total} still in flight)")
                    return in_flight == total

                await until(all_in_flight, 120, "the restarted server to answer")
                serving_s = time.perf_counter() - killed

                async def reconciled() -> bool:
                    """Every gateway has heartbeated to the new server (its held sessions compared with the
                    database), and every session is still in flight."""
                    status = await client.service_status()
                    heard = all((n.last_heartbeat or 0) >= restarted for n in status.nodes)
                    return heard and await all_in_flight()

                await until(reconciled, args.timeout, "the restarted server's reconciliation")
                reconciled_s = time.perf_counter() - killed
                looked_up = await fleet.ask("looked_up") - looked_up
                peak = max(peak, rss_mib(server.pid)[1])

                # 4. drain: every session called back once; nothing lost, nothing run twice
                released = time.perf_counter()
                peak_in_flight, run_twice = await fleet.ask("release", timeout=args.timeout)
                drain_s = time.perf_counter() - released
                done = await client.service_status()
                peak = max(peak, rss_mib(server.pid)[1])
                await fleet.ask("close")
        finally:
            await asyncio.to_thread(fleet.stop)
            await asyncio.to_thread(server.stop)
    finished = done.sessions.get("finished", 0)
    return SizeRow(
        in_flight=peak_in_flight, per_session_ms=(last - first) * 1000 / total,
        p50_ms=percentile(latencies, 0.5), p99_ms=percentile(latencies, 0.99),
        status_busy_ms=(percentile(busy, 0.5), max(busy, default=float("nan"))), status_ms=status_ms,
        task_status_ms=task_status_ms, rss_mib=rss_now, peak_rss_mib=peak, serving_s=serving_s,
        reconciled_s=reconciled_s, looked_up=looked_up, burst_look_ups=burst_look_ups, lost=total - finished,
        sessions_per_call=total / max(1, burst.calls),
        run_twice=run_twice,
        results_per_s=total / drain_s, tasks={str(k): v for k, v in done.tasks.items()},
    )  # fmt: skip


def _ms(pair: tuple[float, float]) -> str:
    return f"{pair[0]:,.1f} / {pair[1]:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,30000,100000", help="sessions in flight, one row each")
    parser.add_argument("--samples", type=int, default=10, help="sessions per task")
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32, help="submits in flight at once")
    parser.add_argument("--idle", type=int, default=100, help="single-session tasks for the idle dispatch latency")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="the server's heartbeat interval (s)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up when a phase takes longer (s)")
    parser.add_argument("--data-dir", help="where server.db goes (default: a temporary dir); its fsync speed counts")
    parser.add_argument("--profile", default="", help="write the server's cProfile statistics to PROFILE.<size>")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",") if n.strip()]

    token = secrets.token_urlsafe(16)
    console = Console(width=240)
    idle = asyncio.run(idle_dispatch(args, token)) if args.idle else None
    rows = []
    submit_ms: list[float] = []
    for size in sizes:
        submit_ms.append(asyncio.run(submit_only(args, size, token)))
        rows.append(asyncio.run(one_size(args, size, token)))
        row = rows[-1]
        console.print(f"{size:,} in flight: {row.per_session_ms:.3f} ms/session (submission alone "
                      f"{submit_ms[-1]:.3f}), p99 {row.p99_ms:,.0f} ms, RSS {row.peak_rss_mib:,.0f} MiB, "
                      f"{row.sessions_per_call:,.1f} sessions per dispatch call")  # fmt: skip

    table = Table(title=f"rollout server at scale ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
                        f"{args.nodes} simulated gateways, {args.samples} sessions per task)")  # fmt: skip
    columns = ("in flight", "dispatch / session", "submission alone / session", "sessions / call",
               "submit->dispatch p50 / p99", "status in burst p50 / max",
               "status p50 / max", "task status p50 / max", "server RSS (peak)", "kill -9: serving / reconciled",
               "look-ups: burst / restart", "lost / run twice", "results/s", "tasks at the end")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for r, alone in zip(rows, submit_ms, strict=True):
        table.add_row(f"{r.in_flight:,}", f"{r.per_session_ms:.3f} ms", f"{alone:.3f} ms",
                      f"{r.sessions_per_call:,.1f}",
                      f"{r.p50_ms:,.0f} / {r.p99_ms:,.0f} ms",
                      f"{_ms(r.status_busy_ms)} ms", f"{_ms(r.status_ms)} ms", f"{_ms(r.task_status_ms)} ms",
                      f"{r.rss_mib:,.0f} MiB ({r.peak_rss_mib:,.0f})", f"{r.serving_s:.1f} s / {r.reconciled_s:.1f} s",
                      f"{r.burst_look_ups:,} / {r.looked_up:,}", f"{r.lost} / {r.run_twice}", f"{r.results_per_s:,.0f}",
                      ", ".join(f"{k} {v}" for k, v in r.tasks.items()))  # fmt: skip
    console.print(table)
    if idle is not None:
        console.print(f"idle dispatch latency p50 / p99: {idle[0]:.2f} / {idle[1]:.2f} ms ({args.idle} single-session "
                      "tasks, one at a time)")  # fmt: skip
    console.print("targets at 100,000 in flight: dispatch <= 0.2 ms per session, submit->dispatch p99 <= 1 s, "
                  "server RSS < 1 GB; nothing lost and nothing run twice through the kill -9")  # fmt: skip


if __name__ == "__main__":
    main()
