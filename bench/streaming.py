"""Time to first byte and total time of a streamed answer: vLLM directly, the proxy in pass-through mode, and the
proxy in synthetic mode, per provider protocol.

A fake streaming vLLM samples at a fixed rate (``--tokens`` tokens at ``--rate`` tokens/s on a fixed schedule, one
chunk per token, token ids and logprobs in every chunk, ``prompt_token_ids`` in the first). Two proxies
(``--stream-mode passthrough`` and ``synthetic``, journaling to a temp dir) sit in front of it. The fake vLLM, each
proxy and the client run in processes of their own, as they would in a deployment (one event loop shared by all of
them would charge the proxy's work to the backend's schedule). Each protocol's streaming request is sent
``--requests`` times one after another; the table shows the median TTFB (the response's first byte, as curl's
``time_starttransfer``: the proxy answers 200 once the upstream's first chunk is in), TTFT (the first byte of the
first token's text) and total time, each beside direct vLLM's: ms added, and total time in % of direct.

``--prompt-tokens`` sets how many prompt ids the first chunk (and a whole answer) carries, as a real vLLM sends them
(32768 for a 32K prompt: ~200 KB of JSON in one chunk); ``--concurrency`` sends that many requests at once per round
(each timed on its own), so the proxy relays that many streams side by side.

    python bench/streaming.py [--tokens 64] [--rate 100] [--requests 5] [--prompt-tokens 512] [--concurrency 1]
        [--protocols openai_chat anthropic]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from proxy_overhead import free_port  # bench/ is on sys.path when a script here runs

from polar_cli.proxy import ProxyConfig, create_proxy_app
from polar_cli.web.parser_errors import app_runner

PROMPT_TOKENS = 512
PROTOCOLS = ["openai_chat", "openai_responses", "anthropic", "google"]
WORD = "Zq"  # every sampled token's text: its first appearance in a body is the first token (TTFT)


def fake_vllm(tokens: int, rate: float, prompt_tokens: int = PROMPT_TOKENS) -> web.Application:
    prompt_ids = [(i * 7919) % 150000 for i in range(prompt_tokens)]  # ids of a real vocabulary's sizes

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": "bench"}
        if not body.get("stream"):  # the whole answer once every token is sampled (the synthetic path's call)
            await asyncio.sleep(tokens / rate)
            entry = {"token": WORD, "logprob": -0.1, "bytes": list(WORD.encode()), "top_logprobs": []}
            message = {"role": "assistant", "content": f"{WORD} " * (tokens - 1)}
            choice = {"index": 0, "message": message, "logprobs": {"content": [entry] * tokens},
                      "finish_reason": "stop", "token_ids": [100 + n for n in range(tokens)]}  # fmt: skip
            answer = {**head, "object": "chat.completion", "prompt_token_ids": prompt_ids, "choices": [choice]}
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        first = {**head, "prompt_token_ids": prompt_ids, "choices": [{"index": 0, "delta": {"role": "assistant",
                 "content": ""}, "logprobs": None, "finish_reason": None, "token_ids": []}]}  # fmt: skip
        await resp.write(b"data: " + orjson.dumps(first) + b"\n\n")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n in range(tokens):
            await asyncio.sleep(max(0.0, start + (n + 1) / rate - loop.time()))  # a fixed schedule, not drifting
            last = n == tokens - 1
            entry = {"token": WORD, "logprob": -0.1, "bytes": list(WORD.encode()), "top_logprobs": []}
            choice = {"index": 0, "delta": {"content": "" if last else f"{WORD} "}, "logprobs": {"content": [entry]},
                      "finish_reason": "stop" if last else None, "token_ids": [100 + n]}  # fmt: skip
            await resp.write(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM does (the proxy asks for it)
            usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": tokens,
                     "total_tokens": len(prompt_ids) + tokens}  # fmt: skip
            await resp.write(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "bench"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


async def serve(app: web.Application) -> tuple[str, web.AppRunner]:
    runner = app_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}", runner


def requests_for(base: str, key: str) -> dict[str, tuple[str, dict[str, str], dict[str, Any]]]:
    user = "Say ok."
    messages = [{"role": "user", "content": user}]
    return {
        "openai_chat": (f"{base}/v1/chat/completions", {"Authorization": f"Bearer {key}"},
                        {"model": "m", "stream": True, "messages": messages}),
        "openai_responses": (f"{base}/v1/responses", {"Authorization": f"Bearer {key}"},
                             {"model": "m", "stream": True, "input": user}),
        "anthropic": (f"{base}/v1/messages", {"x-api-key": key, "anthropic-version": "2023-06-01"},
                      {"model": "m", "stream": True, "max_tokens": 256, "messages": messages}),
        "google": (f"{base}/v1beta/models/m:streamGenerateContent?alt=sse", {"x-goog-api-key": key},
                   {"contents": [{"role": "user", "parts": [{"text": user}]}]}),
    }  # fmt: skip


async def timed(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict[str, Any]
) -> tuple[float, float, float]:
    """(TTFB: time to the response's first byte, its status line, as curl's time_starttransfer; TTFT: time to the
    first token's text; total time) of one streamed request."""
    started = time.perf_counter()
    token = None
    seen = b""
    async with http.post(url, headers=headers, json=body) as resp:
        first = time.perf_counter() - started  # the client has the status line and headers
        assert resp.status == 200, await resp.text()
        async for piece in resp.content.iter_any():
            if token is None:
                seen = seen[-len(WORD) :] + piece
                token = time.perf_counter() - started if WORD.encode() in seen else None
    return first, token or 0.0, time.perf_counter() - started


def _serve_forever(app_factory: Callable[[], web.Application], port: int) -> None:
    """A child process: serve the app on 127.0.0.1:port until terminated."""

    async def run() -> None:
        runner = app_runner(app_factory(), handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(run())


def _proxy_app(config: ProxyConfig) -> web.Application:
    return create_proxy_app(config)


def _start(factory: Callable[[], web.Application]) -> tuple[str, multiprocessing.process.BaseProcess]:
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=_serve_forever, args=(factory, port), daemon=True)
    process.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return url, process
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


async def rounds(
    http: aiohttp.ClientSession,
    call: tuple[str, dict[str, str], dict[str, Any]],
    requests: int,
    concurrency: int,
) -> list[tuple[float, float, float]]:
    """``requests`` rounds of ``concurrency`` requests sent at once, after one warm-up round: every request's times."""
    await asyncio.gather(*(timed(http, *call) for _ in range(concurrency)))
    out: list[tuple[float, float, float]] = []
    for _ in range(requests):
        out += await asyncio.gather(*(timed(http, *call) for _ in range(concurrency)))
    return out


async def main(
    tokens: int, rate: float, requests: int, prompt_tokens: int, concurrency: int, protocols: list[str]
) -> None:
    processes = []
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    try:
        upstream, process = _start(functools.partial(fake_vllm, tokens, rate, prompt_tokens))
        processes.append(process)
        with tempfile.TemporaryDirectory() as journal:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                direct = (f"{upstream}/v1/chat/completions", {}, {"model": "bench", "stream": True, "messages": []})
                results[("direct vLLM", "openai_chat")] = await rounds(http, direct, requests, concurrency)
                for mode in ("passthrough", "synthetic"):
                    config = ProxyConfig(backend="vllm", backend_url=upstream, model="bench", stream_mode=mode,
                                         journal_dir=Path(journal) / mode, control_token="bench")  # fmt: skip
                    base, process = _start(functools.partial(_proxy_app, config))
                    processes.append(process)
                    auth = {"Authorization": f"Bearer {config.control_token}"}
                    async with http.post(f"{base}/sessions", json={}, headers=auth) as resp:
                        session = await resp.json()
                    prefix = f"{base}/s/{session['session_id']}"
                    for provider, call in requests_for(prefix, session["api_key"]).items():
                        if provider in protocols:
                            results[(f"proxy {mode}", provider)] = await rounds(http, call, requests, concurrency)
    finally:
        for process in processes:
            process.terminate()
            process.join(10)
    report(results, tokens, rate, requests * concurrency, prompt_tokens, concurrency)


def report(
    results: dict[tuple[str, str], list[tuple[float, float, float]]],
    tokens: int,
    rate: float,
    n: int,
    prompt_tokens: int,
    concurrency: int,
) -> None:
    medians = {key: [statistics.median(s[k] for s in v) * 1000 for k in range(3)] for key, v in results.items()}
    ttfb0, ttft0, total0 = medians[("direct vLLM", "openai_chat")]
    print(f"{tokens} tokens at {rate:g} tokens/s (sampling alone: {tokens / rate * 1000:.0f} ms), {prompt_tokens} "
          f"prompt ids, concurrency {concurrency}; median of {n}; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("TTFB: the response's first byte; TTFT: the first byte of the first token's text; +: added to direct vLLM's")
    print(f"{'path':<18} {'protocol':<17} {'TTFB ms':>8} {'+TTFB':>7} {'TTFT ms':>8} {'+TTFT':>7} {'total ms':>9} "
          f"{'total/direct':>12}")  # fmt: skip
    for (path, provider), (ttfb, ttft, total) in medians.items():
        print(f"{path:<18} {provider:<17} {ttfb:>8.1f} {ttfb - ttfb0:>+7.1f} {ttft:>8.1f} {ttft - ttft0:>+7.1f} "
              f"{total:>9.1f} {(total / total0 - 1) * 100:>+11.1f}%")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--requests", type=int, default=5, help="rounds of --concurrency requests each")
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--protocols", nargs="+", default=PROTOCOLS, choices=PROTOCOLS)
    args = parser.parse_args()
    asyncio.run(main(args.tokens, args.rate, args.requests, args.prompt_tokens, args.concurrency, args.protocols))
