"""Anthropic Messages codec (``POST /v1/messages``, ``/v1/messages/count_tokens``): what Claude Code speaks.

Decoding lives in :mod:`anthropic_input`. An answer is a ``message`` whose ``content`` is, in order: a ``thinking``
block (when the model reasoned; its signature is :func:`~polar_cli.proxy.codecs.common.sign_thinking`), a ``text``
block (when it wrote text, or when nothing else was produced), then one ``tool_use`` block per tool call. The
synthetic stream replays it with a named ``event:`` line on every frame (Claude Code requires them):
``message_start``, ``ping``, per block ``content_block_start`` / deltas (``thinking_delta`` + ``signature_delta``,
``text_delta``, ``input_json_delta``) / ``content_block_stop``, ``message_delta`` (stop reason, usage),
``message_stop``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from polar_cli.models import Provider
from polar_cli.models.chat import ChatRequest, Generation, StreamDelta, StreamStart
from polar_cli.proxy.codecs.anthropic_input import decode_request
from polar_cli.proxy.codecs.base import Codec, Route, StreamEncoder
from polar_cli.proxy.codecs.common import chunks, load_arguments, new_id, sign_thinking, stable_id
from polar_cli.proxy.sse import sse_event

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def message_id(generation: Generation) -> str:
    """``msg_...``: derived from the backend's id, so the JSON answer and the stream of one generation agree."""
    return stable_id("msg_", generation.id) if generation.id else new_id("msg_")


def stop_reason(generation: Generation, request: ChatRequest) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a generation."""
    if generation.tool_calls and generation.finish_reason != "length":
        return "tool_use", None
    # a backend that knows which stop string ended the text may say so (vLLM's choices[].stop_reason)
    matched = getattr(generation, "stop_sequence", None)
    if isinstance(matched, str) and matched in (request.context.get("stop_sequences") or ()):
        return "stop_sequence", matched
    return _STOP_REASONS.get(generation.finish_reason, "end_turn"), None


def content_blocks(generation: Generation) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    reasoning = generation.reasoning
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": sign_thinking(reasoning)})
    if generation.text or not generation.tool_calls:
        blocks.append({"type": "text", "text": generation.text})
    for k, call in enumerate(generation.tool_calls):
        fn = call.get("function") or {}
        call_id = call.get("id") or stable_id("toolu_", generation.id, k)
        blocks.append(
            {
                "type": "tool_use",
                "id": call_id,
                "name": fn.get("name") or "",
                "input": load_arguments(fn.get("arguments")),
            }
        )
    return blocks


def _usage(generation: Generation) -> dict[str, int]:
    return {
        "input_tokens": generation.prompt_tokens,
        "output_tokens": generation.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return sse_event(data, event)


class AnthropicStreamEncoder(StreamEncoder):
    """Messages stream events: ``message_start`` + ``ping``; a content block per kind of piece in arrival order
    (thinking → ``thinking_delta``s then, at its end, a ``signature_delta`` over the whole thinking text; text →
    ``text_delta``s; each tool call → ``input_json_delta``s). A call's arguments stream as they arrive once they
    start as a JSON object (``{``), as Anthropic streams ``partial_json``; arguments that do not (empty, or not an
    object) are held and sent whole at the call's end, normalized by ``load_arguments`` as a non-streamed answer
    would have them. An empty text block when the answer had neither text nor tool calls; ``message_delta`` (stop
    reason, usage) and ``message_stop``."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.index = -1
        self.kind: str | None = None  # the open block: "thinking", "text", "tool_use"
        self.call: int | None = None  # the open tool call's index
        self.thinking: list[str] = []
        self.arguments: list[str] = []
        self.live = False  # the open call's arguments go out as they arrive
        self.wrote_text = False
        self.wrote_tool = False
        self.message_id = ""
        self.generation_id = ""

    def open(self, start: StreamStart) -> bytes:
        self.message_id = stable_id("msg_", start.id) if start.id else new_id("msg_")
        self.generation_id = start.id
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": start.prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return _frame("message_start", {"type": "message_start", "message": message}) + _frame("ping", {"type": "ping"})

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._stop()
        self.index += 1
        self.kind = kind
        frame = {"type": "content_block_start", "index": self.index, "content_block": block}
        return out + _frame("content_block_start", frame)

    def _delta(self, payload: dict[str, Any]) -> bytes:
        return _frame("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": payload})

    def _json(self, partial: str) -> bytes:
        return self._delta({"type": "input_json_delta", "partial_json": partial})

    def _arguments(self, piece: str) -> bytes:
        self.arguments.append(piece)
        if self.live:
            return self._json(piece) if piece else b""
        text = "".join(self.arguments)
        if text.lstrip().startswith("{"):
            self.live = True
            return self._json(text)
        return b""

    def _stop(self) -> bytes:
        if self.kind is None:
            return b""
        out = b""
        if self.kind == "thinking":
            out += self._delta({"type": "signature_delta", "signature": sign_thinking("".join(self.thinking))})
        elif self.kind == "tool_use" and not self.live:
            arguments = orjson.dumps(load_arguments("".join(self.arguments))).decode()
            out += b"".join(self._json(p) for p in chunks(arguments))
        self.kind = None
        return out + _frame("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def delta(self, delta: StreamDelta) -> bytes:
        out = b""
        if delta.reasoning:
            if self.kind != "thinking":
                out += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self.thinking.append(delta.reasoning)
            out += b"".join(self._delta({"type": "thinking_delta", "thinking": p}) for p in chunks(delta.reasoning))
        if delta.content:
            if self.kind != "text":
                out += self._start("text", {"type": "text", "text": ""})
                self.wrote_text = True
            out += b"".join(self._delta({"type": "text_delta", "text": p}) for p in chunks(delta.content))
        for fragment in delta.tool_calls:
            index = int(fragment.get("index") or 0)
            fn = fragment.get("function") or {}
            if self.kind != "tool_use" or self.call != index:
                call_id = fragment.get("id") or stable_id("toolu_", self.generation_id, index)
                block: dict[str, Any] = {"type": "tool_use", "id": call_id, "name": fn.get("name") or "", "input": {}}
                out += self._start("tool_use", block)
                self.call = index
                self.arguments = []
                self.live = False
                self.wrote_tool = True
            out += self._arguments(fn.get("arguments") or "")
        return out

    def close(self, generation: Generation) -> bytes:
        out = self._stop()
        if not self.wrote_text and not self.wrote_tool:
            out += self._start("text", {"type": "text", "text": ""}) + self._stop()
        reason, sequence = stop_reason(generation, self.request)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out += _frame("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(generation)})
        return out + _frame("message_stop", {"type": "message_stop"})


class AnthropicCodec(Codec):
    """Anthropic Messages ⇄ normalized chat."""

    provider: ClassVar[Provider] = "anthropic"

    def decode(self, body: dict[str, Any], route: Route) -> ChatRequest:
        return decode_request(body)

    def decode_count_tokens(self, body: dict[str, Any], route: Route) -> ChatRequest:
        return decode_request(body, count_only=True)

    def count_tokens_body(self, count: int) -> dict[str, Any]:
        return {"input_tokens": count}

    def encode(self, generation: Generation, request: ChatRequest) -> dict[str, Any]:
        reason, sequence = stop_reason(generation, request)
        return {
            "id": message_id(generation),
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": content_blocks(generation),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(generation),
        }

    def encoder(self, request: ChatRequest) -> AnthropicStreamEncoder:
        return AnthropicStreamEncoder(request)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def stream_error(self, status: int, message: str) -> bytes:
        return _frame("error", self.error_body(status, message))
