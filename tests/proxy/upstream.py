"""A fake vLLM server that misbehaves on demand: the outermost edge of the proxy, which cannot run for real here.

Each chat request takes the next queued action (default: a good answer):

- ``("json", status, body, headers)``: that reply;
- ``"reset"``: the connection is dropped before any byte of the answer;
- ``"truncate"``: a Content-Length answer cut off half-way (the client sees a payload error);
- ``"hang"``: never answers (until ``release()``, so servers shut down promptly);
- streaming requests (``stream: true``) get vLLM's chunk format (``vllm_chunks``); ``"truncate"`` then cuts the
  connection before the first chunk, ``"break"`` after two chunks, ``"error_chunk"`` sends an error object after
  two chunks, and ``token_delay_s`` spaces the token chunks out (a client can leave mid-answer);
- ``("sse", frames)``: a streaming answer of exactly these bytes (each written as it is, in its own write).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import orjson
from aiohttp import web

from .conftest import LoopThread

Action = str | tuple[Any, ...]


def vllm_answer(text: str = "ok", prompt_ids: list[int] | None = None, **choice: Any) -> dict[str, Any]:
    ids = [7, 8, 2]
    prompt_ids = prompt_ids if prompt_ids is not None else [1, 2, 3]
    answer: dict[str, Any] = {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "served-model",
        "prompt_token_ids": prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": {"content": [{"token": "t", "logprob": -0.5, "top_logprobs": []} for _ in ids]},
                "finish_reason": "stop",
                "token_ids": ids,
                **choice,
            }
        ],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + 3},
    }
    return answer


def vllm_chunks(text: str = "ok", prompt_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """The chunks vLLM streams for ``vllm_answer(text, prompt_ids)`` (same ids, text and logprobs): the first carries
    ``prompt_token_ids``, one chunk per sampled token (the end-of-turn token's text is empty), a finish chunk, a usage
    chunk."""
    answer = vllm_answer(text, prompt_ids)
    ids = answer["choices"][0]["token_ids"]
    cut = max(1, len(text) // 2)
    pieces = [text[:cut], text[cut:], ""]
    head = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
    }

    def chunk(delta: dict[str, Any], ids: list[int], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        logprobs = {"content": [{"token": "t", "logprob": -0.5, "bytes": [116], "top_logprobs": []} for _ in ids]}
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs if ids else None,
            "finish_reason": finish,
            "token_ids": ids,
        }
        return {**head, **extra, "choices": [choice]}

    out = [chunk({"role": "assistant", "content": ""}, [], prompt_token_ids=answer["prompt_token_ids"])]
    out += [chunk({"content": piece}, [i]) for piece, i in zip(pieces, ids, strict=True)]
    out.append(chunk({}, [], "stop"))
    out.append({**head, "choices": [], "usage": answer["usage"]})
    return out


class Upstream:
    """The fake server, served on a LoopThread."""

    def __init__(
        self, loop_thread: LoopThread, *, delay_s: float = 0.0, prompt_tokens: int = 3, token_delay_s: float = 0.0
    ) -> None:
        self.actions: list[Action] = []
        self.token_delay_s = token_delay_s
        self.stream_closed: asyncio.Event | None = None
        self.streams_finished = 0
        self.dropped_in_prefill = threading.Event()
        self.requests = 0
        self.delay_s = delay_s
        self.prompt_ids = list(range(1, prompt_tokens + 1))
        self._lock = threading.Lock()
        self._release: asyncio.Event | None = None
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self.loop_thread = loop_thread
        self.url = loop_thread.serve(app)

    def release(self) -> None:
        """Let every hanging request end (with a 503)."""

        async def go() -> None:
            if self._release is not None:
                self._release.set()

        self.loop_thread.run(go())

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        with self._lock:
            self.requests += 1
            action: Action = self.actions.pop(0) if self.actions else "ok"
        if self.delay_s:  # the prefill: ends early when the proxy drops the request
            deadline = time.monotonic() + self.delay_s
            while time.monotonic() < deadline:
                if request.transport is None or request.transport.is_closing():
                    self.dropped_in_prefill.set()
                    return web.Response()
                await asyncio.sleep(0.01)
        if action == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if body.get("stream") and action in ("ok", "truncate", "break", "error_chunk"):
            return await self._stream(request, body, action)
        if action == "truncate":
            raw = orjson.dumps(vllm_answer())
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(raw)
            await resp.prepare(request)
            await resp.write(raw[: len(raw) // 2])
            assert request.transport is not None
            request.transport.abort()
            return resp
        if action == "hang":
            if self._release is None:
                self._release = asyncio.Event()
            await self._release.wait()
            return web.json_response({"error": {"message": "released"}}, status=503)
        if isinstance(action, tuple) and action[0] == "sse":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for frame in action[1]:
                await resp.write(frame)
            return resp
        if isinstance(action, tuple) and action[0] == "json":
            _, status, answer, headers = (*action, None)[:4]
            return web.json_response(answer, status=status, headers=headers)
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        return web.json_response(vllm_answer(f"echo: {last}", self.prompt_ids))

    async def _stream(self, request: web.Request, body: dict[str, Any], action: Action) -> web.StreamResponse:
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = vllm_chunks(f"echo: {last}", self.prompt_ids)
        try:
            for n, chunk in enumerate(chunks):
                if (n == 2 and action == "break") or action == "truncate":
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if n == 2 and action == "error_chunk":
                    await resp.write(b'data: {"error": {"message": "engine died", "code": 500}}\n\n')
                    return resp
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                if self.token_delay_s and n:
                    await asyncio.sleep(self.token_delay_s)
            await resp.write(b"data: [DONE]\n\n")
            self.streams_finished += 1
        except (ConnectionResetError, asyncio.CancelledError):
            if self.stream_closed is not None:
                self.stream_closed.set()
            raise
        return resp
