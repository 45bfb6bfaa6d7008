"""Pass-through streaming: upstream SSE chunks are re-encoded in the client's provider protocol as they arrive.

A backend that streams token ids (vLLM with ``return_token_ids``) hands the pump an :class:`UpstreamStream` of OpenAI
``chat.completion.chunk`` objects. :class:`StreamAssembler` turns each chunk into a :class:`StreamDelta` (what the
client sees next) and keeps every token id and logprob, so the finished stream is the same :class:`Generation` a
non-streaming call would have produced. :func:`pump` drives a codec's incremental encoder with those deltas:

- the response headers go out only once the upstream has answered 200, so errors before that are ordinary
  provider-shaped HTTP errors;
- when the upstream ends, the generation is checked and journaled, then the closing events are sent: a client that
  has seen the end of the stream can read its completion;
- an upstream failure mid-stream (reset, bad chunk, an ``error`` object, no finish) is the provider's stream error
  event, never a silently truncated stream; nothing is journaled;
- a client that disconnects aborts the upstream request the moment its connection is lost (``http.client_gone``),
  during the prefill too (:func:`unless_client_leaves`); what was sampled so far is journaled with finish_reason
  ``abort`` and ``metadata.delivery = "aborted"`` (builders give such completions no trainable tokens).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web

from polar_cli.aio import cancel_and_wait
from polar_cli.errors import BackendError
from polar_cli.models.chat import ChatRequest, Generation, JsonTokenIds, StreamDelta, StreamStart, UpstreamStream
from polar_cli.models.completion import ABORTED
from polar_cli.proxy.capture import Delivery, check_generation
from polar_cli.proxy.codecs.base import Codec, StreamEncoder
from polar_cli.proxy.token_json import json_ids_count
from polar_cli.web.disconnect import client_gone, client_left

log = logging.getLogger("polar.proxy.streaming")

_BLANK = b" \t\x0b\x0c"  # what bytes.strip() removes, less the line ends
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
ABORT = ABORTED
T = TypeVar("T")


class UpstreamStreamError(BackendError):
    """The upstream stream broke after it started."""


async def sse_chunks(content: Any, load: Callable[[bytes], Any] = orjson.loads) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an OpenAI-style SSE body (``data: {...}`` frames up to ``data: [DONE]``), read in
    pieces of any size (vLLM's first chunk carries the whole prompt's ids: no line-length limit applies). ``load``
    parses one chunk's JSON (vLLM's keeps the prompt ids as text: :func:`~polar_cli.proxy.token_json.
    loads_keeping_prompt_ids`). A frame that comes in many pieces is searched once, not once per piece."""
    buffer = bytearray()
    searched = 0  # the buffer before this holds no frame end
    async for piece in content.iter_any():
        buffer += piece
        while True:
            cut = _frame_end(buffer, searched)
            if cut < 0:
                searched = max(0, len(buffer) - 1)
                break
            values = _data_values(buffer, cut)
            del buffer[: cut + 2]
            searched = 0
            for data in values:
                if data == b"[DONE]":
                    return
                try:
                    chunk = load(data)
                except orjson.JSONDecodeError as exc:
                    raise UpstreamStreamError(f"the backend streamed a chunk that is not JSON: {data[:200]!r}") from exc
                if not isinstance(chunk, dict):
                    raise UpstreamStreamError("the backend streamed a chunk that is not an object")
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"]
                    message = err.get("message") if isinstance(err, dict) else err
                    raise UpstreamStreamError(f"the backend failed mid-stream: {str(message)[:500]}")
                yield chunk
    raise UpstreamStreamError("the backend's stream ended before data: [DONE]")


def _data_values(buffer: bytearray, cut: int) -> list[bytes]:
    """The stripped values of the ``data:`` lines of the frame ``buffer[:cut]``. A frame of one ``data:`` line, as
    vLLM sends every chunk, has its value copied out of the buffer once (a 32K prompt's first chunk is 200 KB: copying
    the frame, slicing and stripping it were three copies)."""
    with memoryview(buffer) as view:
        if buffer.startswith(b"data:") and buffer.find(b"\n", 0, cut) < 0 and buffer.find(b"\r", 0, cut) < 0:
            start, end = 5, cut
            while start < end and buffer[start] in _BLANK:
                start += 1
            while end > start and buffer[end - 1] in _BLANK:
                end -= 1
            return [bytes(view[start:end])]
        frame = bytes(view[:cut])
    return [line[5:].strip() for line in frame.splitlines() if line.startswith(b"data:")]


def _frame_end(buffer: bytearray, start: int) -> int:
    """Where the first ``\n\n`` at or after ``start`` begins, -1 if none. Each ``\n`` is found with one memchr:
    ``find(b"\n\n")`` walks a 200 KB frame of digits at ~0.8 ns a byte (~160 us before a 32K stream's first byte),
    a one-byte find at ~0.01."""
    at = buffer.find(b"\n", start)
    end = len(buffer) - 1
    while 0 <= at < end:
        if buffer[at + 1] == 10:  # "\n"
            return at
        at = buffer.find(b"\n", at + 1)
    return -1


class StreamAssembler:
    """OpenAI chat chunks (vLLM, ``return_token_ids``) → deltas for the client, and the whole Generation at the end."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.start: StreamStart | None = None
        self.prompt_ids: list[int] | JsonTokenIds | None = None
        self.response_ids: list[int] = []
        self.logprobs: list[dict[str, Any]] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.started = time.perf_counter()

    def feed(self, chunk: dict[str, Any]) -> tuple[StreamStart | None, StreamDelta]:
        """Take one chunk; returns the stream's start (on the first chunk only) and the piece to send."""
        opened = None
        prompt = chunk.get("prompt_token_ids")
        if prompt is not None:
            self.prompt_ids = prompt
        if self.start is None:
            self.start = StreamStart(
                id=str(chunk.get("id") or ""),
                created=int(chunk.get("created") or time.time()),
                model=str(chunk.get("model") or ""),
                prompt_tokens=json_ids_count(prompt) if isinstance(prompt, JsonTokenIds) else len(prompt or ()),
            )
            opened = self.start
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(self.prompt_ids, JsonTokenIds):
            reported = usage.get("prompt_tokens")
            if type(reported) is int and self.prompt_ids.length < 0:
                self.prompt_ids.length = reported  # vLLM's count of the ids it sent: the end's check compares
        delta = StreamDelta()
        choices = chunk.get("choices") or []
        if not choices:
            return opened, delta
        choice = choices[0]
        ids = choice.get("token_ids")
        if ids:
            self.response_ids.extend(ids)
        entries = (choice.get("logprobs") or {}).get("content") or []
        self.logprobs.extend(entries)
        delta.logprobs = list(entries)
        raw = choice.get("delta") or {}
        reasoning = raw.get("reasoning_content") or raw.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            delta.reasoning = reasoning
            self.reasoning.append(reasoning)
        if isinstance(raw.get("content"), str) and raw["content"]:
            delta.content = raw["content"]
            self.content.append(raw["content"])
        for fragment in raw.get("tool_calls") or []:
            index = int(fragment.get("index") or 0)
            fn = fragment.get("function") or {}
            call = self.calls.setdefault(index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or fragment.get("id")
            call["name"] = call["name"] or fn.get("name")
            call["arguments"] += fn.get("arguments") or ""
            delta.tool_calls.append(
                {
                    "index": index,
                    "id": fragment.get("id"),
                    "function": {"name": fn.get("name"), "arguments": fn.get("arguments") or ""},
                }
            )
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        return opened, delta

    def generation(self, finish_reason: str | None = None) -> Generation:
        """The finished answer; ``finish_reason`` overrides the upstream's (``abort``)."""
        reason = finish_reason or self.finish_reason
        if reason is None:
            raise UpstreamStreamError("the backend's stream ended without a finish_reason")
        if self.prompt_ids is None:
            raise UpstreamStreamError("the backend streamed no prompt_token_ids; return_token_ids needs vLLM >= 0.10.2")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.calls.items())
            ]
        logprobs = tokens = None
        if len(self.logprobs) == len(self.response_ids):
            logprobs = [float(e["logprob"]) for e in self.logprobs]
            tokens = [str(e.get("token", "")) for e in self.logprobs]
        start = self.start or StreamStart("", int(time.time()), "")
        return Generation(
            id=start.id,
            model=start.model,
            message=message,
            finish_reason=reason,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_logprobs=logprobs,
            response_tokens=tokens,
            backend=self.backend,
            backend_seconds=time.perf_counter() - self.started,
            created=start.created,
        )


Record = Callable[[Generation, Delivery], Awaitable[None]]
"""Journals one finished (or aborted) generation with how it was delivered."""


async def unless_client_leaves(request: web.Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ConnectionResetError as soon as the client hangs up first (``work`` is then cancelled:
    an upstream request still in its prefill is dropped, and vLLM stops it)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(client_gone(request).wait())
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            await cancel_and_wait(task)
    if task.cancelled():
        raise ConnectionResetError("the client left before the backend answered")
    return task.result()


async def _stop_when_gone(request: web.Request, upstream: UpstreamStream) -> None:
    await client_gone(request).wait()
    upstream.abort()


async def pump(
    request: web.Request,
    upstream: UpstreamStream,
    codec: Codec,
    encoder: StreamEncoder,
    chat: ChatRequest,
    record: Record,
    *,
    backend: str,
    time_left: float | None = None,
) -> web.StreamResponse:
    """Stream one answer to the client as the upstream produces it (see the module docstring)."""
    answer = web.StreamResponse(status=200, headers=SSE_HEADERS)
    assembler = StreamAssembler(backend)
    gone = client_gone(request)
    watcher = asyncio.create_task(_stop_when_gone(request, upstream))  # a hang-up stops the upstream at once
    try:
        await answer.prepare(request)
        async with asyncio.timeout(time_left):
            async for chunk in upstream.chunks():
                if gone.is_set():
                    raise ConnectionResetError("client gone")
                opened, delta = assembler.feed(chunk)
                out = _encoded(encoder, opened, delta)
                if out:
                    await answer.write(out)
        if gone.is_set() and assembler.finish_reason is None:
            raise ConnectionResetError("client gone")  # the upstream was stopped: what was sampled is an abort
        generation = assembler.generation()
        check_generation(generation)
        await record(generation, "client_gone" if gone.is_set() or client_left(request) else "answered")
    except (ConnectionResetError, asyncio.CancelledError) as exc:
        upstream.abort()
        await _record_abort(assembler, record)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return answer
    except Exception as exc:
        upstream.abort()
        if gone.is_set():  # the stopped upstream broke because the client left
            await _record_abort(assembler, record)
            return answer
        return await _failed(answer, codec, backend, exc)
    finally:
        watcher.cancel()
    try:
        await answer.write(encoder.close(generation))
        await answer.write_eof()
    except ConnectionResetError:
        pass  # journaled as answered: the whole answer was sampled, only its last bytes were lost
    return answer


async def _failed(answer: web.StreamResponse, codec: Codec, backend: str, exc: Exception) -> web.StreamResponse:
    """The stream's end for a failure after the headers went out: the provider's error event."""
    if isinstance(exc, TimeoutError):
        return await _fail(answer, codec, 504, "no complete backend answer before the session's deadline")
    if isinstance(exc, EncodeError):
        log.error("a stream could not be encoded for the client: %s", exc)
        return await _fail(answer, codec, 500, str(exc))
    if isinstance(exc, BackendError):
        log.warning("stream from %s failed: %s", backend, exc)
        return await _fail(answer, codec, exc.status if exc.status >= 500 else 502, str(exc))
    # e.g. aiohttp.ClientPayloadError: the upstream connection broke mid-stream
    log.warning("stream from %s broke: %s: %s", backend, type(exc).__name__, exc)
    return await _fail(answer, codec, 502, f"the backend's stream broke: {type(exc).__name__}: {exc}")


class EncodeError(Exception):
    """The proxy's own encoder failed on a piece (a bug, not the backend's fault): the stream ends in an error event."""


def _encoded(encoder: StreamEncoder, opened: StreamStart | None, delta: StreamDelta) -> bytes:
    try:
        out = encoder.open(opened) if opened is not None else b""
        return out + encoder.delta(delta) if delta else out
    except Exception as exc:
        raise EncodeError(f"the proxy could not encode the stream: {type(exc).__name__}: {exc}") from exc


async def _record_abort(assembler: StreamAssembler, record: Record) -> None:
    if assembler.prompt_ids is None:
        return  # nothing sampled yet: nothing to keep
    try:
        generation = assembler.generation(ABORT)
        check_generation(generation)
        await record(generation, "aborted")
    except BackendError as exc:
        log.warning("an aborted stream could not be recorded: %s", exc)


async def _fail(answer: web.StreamResponse, codec: Codec, status: int, message: str) -> web.StreamResponse:
    try:
        await answer.write(codec.stream_error(status, message[:2000]))
        await answer.write_eof()
    except ConnectionResetError:
        pass
    return answer
