"""Added latency and throughput of the Polar proxy versus calling the inference server directly.

A zero-latency fake vLLM (its own process) answers every chat request with a canned vLLM-shaped body for a 32K-token
prompt (32K ``prompt_token_ids``, 32 sampled ids with logprobs). The proxy (``polar proxy --backend vllm``, its own
process, journaling to a temp dir) sits in front of it. The client sends the same ~32K-token OpenAI chat body to both,
at concurrency 1, 16 and 64, and prints p50/p99 latency, what the proxy adds, and throughput.

    python bench/proxy_overhead.py [--requests 400] [--prompt-tokens 32768] [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from procs import free_port

RESPONSE_TOKENS = 32

CONTROL_TOKEN = secrets.token_urlsafe(24)  # the proxy's control routes always need one


def canned_answer(prompt_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "bench",
            "prompt_token_ids": [(i * 7919) % 150000 for i in range(prompt_tokens)],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok " * (RESPONSE_TOKENS - 1), "tool_calls": []},
                    "logprobs": {
                        "content": [
                            {"token": "ok", "logprob": -0.01 * i, "bytes": [111, 107], "top_logprobs": []}
                            for i in range(RESPONSE_TOKENS)
                        ]
                    },
                    "finish_reason": "stop",
                    "token_ids": list(range(100, 100 + RESPONSE_TOKENS)),
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": RESPONSE_TOKENS},
        }
    )


def serve_fake_vllm(port: int, prompt_tokens: int) -> None:
    """The zero-latency backend: reads the body, answers the canned bytes."""
    body = canned_answer(prompt_tokens)

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench"}]})

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def request_body(prompt_tokens: int) -> bytes:
    # ~4 characters per token of ordinary text
    words = " ".join(f"word{i % 977}" for i in range(prompt_tokens // 2))
    return orjson.dumps(
        {
            "model": "bench",
            "messages": [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": words}],
            "max_tokens": RESPONSE_TOKENS,
            "temperature": 1.0,
        }
    )


async def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if proc.poll() is not None:
                raise SystemExit(f"{url}: process exited with {proc.returncode}")
            try:
                async with session.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


async def run_load(
    url: str, headers: dict[str, str], body: bytes, total: int, concurrency: int
) -> tuple[list[float], float]:
    latencies: list[float] = []
    counter = iter(range(total))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json", **headers}) as s:

        async def worker() -> None:
            for _ in counter:
                started = time.perf_counter()
                async with s.post(url, data=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
                latencies.append(time.perf_counter() - started)

        # warm-up: connections, first-call caches
        for _ in range(min(concurrency, 8)):
            async with s.post(url, data=body) as resp:
                await resp.read()
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return latencies, total / elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def bench(args: argparse.Namespace) -> None:
    backend_port, proxy_port = free_port(), free_port()
    journal = Path(tempfile.mkdtemp(prefix="polar-bench-journal-"))
    env = {**os.environ, "POLAR_LOAD_PLUGINS": ""}
    backend = subprocess.Popen(
        [sys.executable, __file__, "--serve-backend", str(backend_port), "--prompt-tokens", str(args.prompt_tokens)]
    )
    proxy_cmd = [sys.executable, "-m", "polar_cli", "proxy", "--backend", "vllm", "--port", str(proxy_port),
                 "--backend-url", f"http://127.0.0.1:{backend_port}/v1", "--model", "bench",
                 "--control-token", CONTROL_TOKEN]  # fmt: skip
    if not args.no_journal:
        proxy_cmd += ["--journal", str(journal)]
    proxy = subprocess.Popen(proxy_cmd, env=env, stdout=subprocess.DEVNULL)
    try:
        await wait_ready(f"http://127.0.0.1:{backend_port}/v1/models", backend)
        await wait_ready(f"http://127.0.0.1:{proxy_port}/healthz", proxy)
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"http://127.0.0.1:{proxy_port}/sessions",
                json={"session_id": "bench"},
                headers={"Authorization": f"Bearer {CONTROL_TOKEN}"},
            ) as resp,
        ):
            info = await resp.json()
        body = request_body(args.prompt_tokens)
        direct_url = f"http://127.0.0.1:{backend_port}/v1/chat/completions"
        proxy_url = info["base_urls"]["openai"] + "/chat/completions"
        auth = {"Authorization": f"Bearer {info['api_key']}"}
        print(f"prompt: {args.prompt_tokens} tokens ({len(body) / 1024:.0f} KiB request, "
              f"{len(canned_answer(args.prompt_tokens)) / 1024:.0f} KiB backend answer); "
              f"journal: {'off' if args.no_journal else journal}; cpus: {os.cpu_count()}")  # fmt: skip
        header = (
            f"{'conc':>4} {'requests':>8} | {'direct p50':>10} {'p99':>7} {'req/s':>7} | "
            f"{'proxy p50':>9} {'p99':>7} {'req/s':>7} | {'added p50':>9} {'added p99':>9}"
        )
        print(header)
        print("-" * len(header))
        for concurrency in args.concurrency:
            total = args.requests if concurrency > 1 else max(args.requests // 2, 50)
            direct, direct_tput = await run_load(direct_url, {}, body, total, concurrency)
            proxied, proxy_tput = await run_load(proxy_url, auth, body, total, concurrency)
            d50, d99, p50, p99 = pct(direct, 0.5), pct(direct, 0.99), pct(proxied, 0.5), pct(proxied, 0.99)
            print(
                f"{concurrency:>4} {total:>8} | {d50:>8.2f}ms {d99:>5.2f}ms {direct_tput:>7.0f} | "
                f"{p50:>7.2f}ms {p99:>5.2f}ms {proxy_tput:>7.0f} | {p50 - d50:>7.2f}ms {p99 - d99:>7.2f}ms"
            )
    finally:
        for proc in (proxy, backend):
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(journal, ignore_errors=True)  # ~0.5 MB per call: a run leaves hundreds of MB otherwise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--prompt-tokens", type=int, default=32768)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--no-journal", action="store_true", help="keep completions in memory instead")
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_backend:
        serve_fake_vllm(args.serve_backend, args.prompt_tokens)
        return
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
