"""Time to first byte and total time of a streamed answer: vLLM directly, the proxy in pass-through mode, and the
proxy in synthetic mode, per provider protocol.

A fake streaming vLLM samples at a fixed rate (``--tokens`` tokens at ``--rate`` tokens/s, one chunk per token, token
ids and logprobs in every chunk, ``prompt_token_ids`` in the first). Two proxies (``--stream-mode passthrough`` and
``synthetic``, journaling to a temp dir) sit in front of it, all in this process. Each protocol's streaming request
is sent ``--requests`` times one after another; the table shows the median TTFB (first body byte) and total time.

    python bench/streaming.py [--tokens 64] [--rate 100] [--requests 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from polar_cli.http import app_runner
from polar_cli.proxy.app import create_proxy_app
from polar_cli.proxy.config import ProxyConfig

PROMPT_IDS = list(range(1, 513))


def fake_vllm(tokens: int, rate: float) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": "bench"}
        if not body.get("stream"):  # the whole answer once every token is sampled (the synthetic path's call)
            await asyncio.sleep(tokens / rate)
            entry = {"token": "ok", "logprob": -0.1, "bytes": [111, 107], "top_logprobs": []}
            message = {"role": "assistant", "content": "ok " * (tokens - 1)}
            choice = {"index": 0, "message": message, "logprobs": {"content": [entry] * tokens},
                      "finish_reason": "stop", "token_ids": [100 + n for n in range(tokens)]}  # fmt: skip
            answer = {**head, "object": "chat.completion", "prompt_token_ids": PROMPT_IDS, "choices": [choice]}
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        first = {**head, "prompt_token_ids": PROMPT_IDS, "choices": [{"index": 0, "delta": {"role": "assistant",
                 "content": ""}, "logprobs": None, "finish_reason": None, "token_ids": []}]}  # fmt: skip
        await resp.write(b"data: " + orjson.dumps(first) + b"\n\n")
        for n in range(tokens):
            await asyncio.sleep(1 / rate)
            last = n == tokens - 1
            entry = {"token": "ok", "logprob": -0.1, "bytes": [111, 107], "top_logprobs": []}
            choice = {"index": 0, "delta": {"content": "" if last else "ok "}, "logprobs": {"content": [entry]},
                      "finish_reason": "stop" if last else None, "token_ids": [100 + n]}  # fmt: skip
            await resp.write(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
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
) -> tuple[float, float]:
    started = time.perf_counter()
    async with http.post(url, headers=headers, json=body) as resp:
        assert resp.status == 200, await resp.text()
        first = None
        async for _ in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - started
    return first or 0.0, time.perf_counter() - started


async def main(tokens: int, rate: float, requests: int) -> None:
    upstream, up_runner = await serve(fake_vllm(tokens, rate))
    runners = [up_runner]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as journal:
        async with aiohttp.ClientSession() as http:
            direct = (f"{upstream}/v1/chat/completions", {}, {"model": "bench", "stream": True, "messages": []})
            for _ in range(requests):
                results.setdefault(("direct vLLM", "openai_chat"), []).append(await timed(http, *direct))
            for mode in ("passthrough", "synthetic"):
                config = ProxyConfig(backend="vllm", backend_url=upstream, model="bench", stream_mode=mode,
                                     journal_dir=Path(journal) / mode)  # fmt: skip
                base, runner = await serve(create_proxy_app(config))
                runners.append(runner)
                auth = {"Authorization": f"Bearer {config.control_token}"}
                async with http.post(f"{base}/sessions", json={}, headers=auth) as resp:
                    session = await resp.json()
                prefix = f"{base}/s/{session['session_id']}"
                for provider, call in requests_for(prefix, session["api_key"]).items():
                    for _ in range(requests):
                        results.setdefault((f"proxy {mode}", provider), []).append(await timed(http, *call))
    for runner in reversed(runners):
        await runner.cleanup()
    print(f"{tokens} tokens at {rate:g} tokens/s (sampling alone: {tokens / rate * 1000:.0f} ms); median of {requests}")
    print(f"{'path':<20} {'protocol':<18} {'TTFB ms':>9} {'total ms':>9}")
    for (path, provider), samples in results.items():
        ttfb = statistics.median(s[0] for s in samples) * 1000
        total = statistics.median(s[1] for s in samples) * 1000
        print(f"{path:<20} {provider:<18} {ttfb:>9.1f} {total:>9.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.tokens, args.rate, args.requests))
