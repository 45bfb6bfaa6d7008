"""Benchmark: the gateway's inference pool (``polar_cli.proxy.pool``).

1. **Throughput over replicas.** Fake inference servers run in a child process of their own (aiohttp, vLLM's answer
   shape), each with a fixed service rate: ``--slots`` calls at once, each taking ``--service-ms``. This process
   drives one ``InferencePool`` of 1, 2 and 4 of them (the real vLLM client over HTTP) from ``--sessions`` sessions
   calling in a loop for ``--seconds``. Printed: calls/s, the ratio to 1 replica (goals ≥ 1.9x and ≥ 3.7x) and the
   replicas' own ceiling (replicas x slots / service time) beside it.
2. **Routing cost per call.** The same calls through a pool and straight to its one client (an in-process client
   that answers at once, so only the pool's own work differs): the added time per call (goal ≤ 0.1 ms).
3. **Pause to quiet across 8 gateways.** Eight pools (one per gateway), each with ``--in-flight`` calls of random
   length (up to ``--call-ms``) kept going; all eight are paused at once (``wait``). Printed: the time from the pause
   call to the last pool being quiet, the longest call still in flight at the pause, and the difference (goal ≤ 50 ms
   beyond the longest call).

    python bench/inference_pool.py [--seconds 4] [--slots 4] [--service-ms 50] [--sessions 64]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import socket
import statistics
import time
from multiprocessing.connection import Connection

import orjson
from aiohttp import web
from rich.console import Console
from rich.table import Table

from polar_cli.interfaces.backend import BackendClient
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy import InferencePool, RetryConfig
from polar_cli.registry import get_backend

ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "bench",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "logprobs": {"content": [{"token": "t", "logprob": -0.5, "top_logprobs": []}] * 3},
            "finish_reason": "stop",
            "token_ids": [7, 8, 2],
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
}
MODELS = {"object": "list", "data": [{"id": "bench", "object": "model"}]}


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for sock in socks:
        sock.close()
    return ports


def _replicas_main(ports: list[int], slots: int, service_s: float, ready: Connection) -> None:
    """The child process: one fake inference server per port, each serving ``slots`` calls at a time."""

    async def main() -> None:
        body = orjson.dumps(ANSWER)
        for port in ports:
            gate = asyncio.Semaphore(slots)

            async def chat(request: web.Request, gate: asyncio.Semaphore = gate) -> web.Response:
                await request.read()
                async with gate:
                    await asyncio.sleep(service_s)
                return web.Response(body=body, content_type="application/json")

            async def models(request: web.Request) -> web.Response:
                return web.json_response(MODELS)

            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            app.router.add_get("/v1/models", models)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.send(True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _request() -> ChatRequest:
    return ChatRequest(model="bench", messages=[{"role": "user", "content": "hi"}])


async def _throughput(urls: list[str], sessions: int, seconds: float) -> float:
    def make(url: str | None) -> BackendClient:
        return get_backend("vllm").client(url=url, model="bench", retry=RetryConfig(attempts=1))

    pool = InferencePool(make, urls)
    done = 0
    stop = time.monotonic() + seconds

    async def session(n: int) -> None:
        nonlocal done
        while time.monotonic() < stop:
            await pool.generate(_request(), session_id=f"s{n}")
            done += 1

    await asyncio.gather(*(pool.generate(_request(), session_id=f"warm{n}") for n in range(len(urls) * 4)))
    started = time.monotonic()
    await asyncio.gather(*(session(n) for n in range(sessions)))
    elapsed = time.monotonic() - started
    await pool.close()
    return done / elapsed


class Instant(BackendClient):
    """Answers at once (in process): what is left is the caller's own work."""

    name = "instant"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        if self.delay_s:
            await asyncio.sleep(random.uniform(0, self.delay_s))
        return Generation(id="g", model="m", message={"role": "assistant", "content": "x"}, finish_reason="stop",
                          prompt_ids=[1], response_ids=[2])  # fmt: skip

    async def count_tokens(self, request: ChatRequest) -> int:
        return 1


async def _routing_cost(calls: int) -> tuple[float, float]:
    client = Instant()
    pool = InferencePool(lambda url: client, ["http://a:1", "http://b:1", "http://c:1", "http://d:1"])
    request = _request()
    rounds_direct, rounds_pool = [], []
    for _ in range(5):
        started = time.perf_counter()
        for n in range(calls):
            await client.generate(request, session_id=f"s{n % 256}")
        rounds_direct.append((time.perf_counter() - started) / calls)
        started = time.perf_counter()
        for n in range(calls):
            await pool.generate(request, session_id=f"s{n % 256}")
        rounds_pool.append((time.perf_counter() - started) / calls)
    await pool.close()
    return statistics.median(rounds_direct), statistics.median(rounds_pool)


async def _pause_to_quiet(gateways: int, in_flight: int, call_s: float) -> tuple[float, float]:
    """(seconds from the pause call to the last pool quiet, longest call in flight at the pause)."""
    ends: list[float] = []

    class Timed(BackendClient):
        name = "timed"

        async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
            length = random.uniform(0, call_s)
            ends.append(time.monotonic() + length)
            await asyncio.sleep(length)
            return await Instant().generate(request, session_id=session_id)

        async def count_tokens(self, request: ChatRequest) -> int:
            return 1

    pools = [InferencePool.of(Timed()) for _ in range(gateways)]
    stop = False

    async def keep_calling(pool: InferencePool, n: int) -> None:
        while not stop:
            await pool.generate(_request(), session_id=f"s{n}")

    workers = [asyncio.create_task(keep_calling(p, n)) for p in pools for n in range(in_flight)]
    await asyncio.sleep(call_s * 2)
    paused_at = time.monotonic()
    longest = max(ends) - paused_at
    await asyncio.gather(*(p.pause("wait", timeout_s=60) for p in pools))
    quiet = time.monotonic() - paused_at
    stop = True
    for pool in pools:
        await pool.resume()
    await asyncio.gather(*workers)
    return quiet, longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=50.0)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--routing-calls", type=int, default=20000)
    parser.add_argument("--gateways", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--call-ms", type=float, default=200.0)
    args = parser.parse_args()
    console = Console()

    ports = _ports(4)
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_replicas_main, args=(ports, args.slots, args.service_ms / 1000, child), daemon=True
    )
    process.start()
    parent.recv()
    try:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        per_replica = args.slots / (args.service_ms / 1000)
        rates = {n: asyncio.run(_throughput(urls[:n], args.sessions, args.seconds)) for n in (1, 2, 4)}
    finally:
        process.kill()
    table = Table(title=f"1. throughput: {args.sessions} sessions, replicas of {args.slots} slots x "
                  f"{args.service_ms:g} ms (ceiling {per_replica:.0f} calls/s each)")  # fmt: skip
    for column in ("replicas", "calls/s", "x 1 replica", "goal", "ceiling calls/s", "ceiling x"):
        table.add_column(column, justify="right")
    goals = {1: "", 2: "≥ 1.9x", 4: "≥ 3.7x"}
    for n, rate in rates.items():
        table.add_row(str(n), f"{rate:.0f}", f"{rate / rates[1]:.2f}x", goals[n], f"{n * per_replica:.0f}",
                      f"{n:.2f}x")  # fmt: skip
    console.print(table)

    direct, pooled = asyncio.run(_routing_cost(args.routing_calls))
    table = Table(title=f"2. routing cost: {args.routing_calls} calls over 4 replicas, 256 sessions (median of 5)")
    for column in ("straight to the client", "through the pool", "added per call", "goal"):
        table.add_column(column, justify="right")
    table.add_row(f"{direct * 1e6:.1f} µs", f"{pooled * 1e6:.1f} µs", f"{(pooled - direct) * 1e3:.4f} ms", "≤ 0.1 ms")
    console.print(table)

    runs = [asyncio.run(_pause_to_quiet(args.gateways, args.in_flight, args.call_ms / 1000)) for _ in range(5)]
    table = Table(title=f"3. pause (wait) to quiet: {args.gateways} gateways x {args.in_flight} calls in flight "
                  f"(each up to {args.call_ms:g} ms), 5 runs")  # fmt: skip
    for column in ("run", "pause → quiet", "longest call left", "beyond it", "goal"):
        table.add_column(column, justify="right")
    for n, (quiet, longest) in enumerate(runs, 1):
        table.add_row(str(n), f"{quiet * 1e3:.1f} ms", f"{longest * 1e3:.1f} ms", f"{(quiet - longest) * 1e3:.1f} ms",
                      "≤ 50 ms")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
