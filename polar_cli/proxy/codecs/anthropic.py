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

from collections.abc import Iterator
from typing import Any, ClassVar

import orjson

from polar_cli.models import Provider
from polar_cli.proxy.codecs.anthropic_input import decode_request
from polar_cli.proxy.codecs.base import Codec, Route
from polar_cli.proxy.codecs.common import chunks, load_arguments, new_id, sign_thinking, stable_id
from polar_cli.proxy.sse import sse_event
from polar_cli.proxy.types import ChatRequest, Generation

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


def _block_events(index: int, block: dict[str, Any]) -> Iterator[bytes]:
    kind = block["type"]

    def delta(payload: dict[str, Any]) -> bytes:
        return _frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload})

    if kind == "thinking":
        start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
    elif kind == "text":
        start = {"type": "text", "text": ""}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    yield _frame("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
    if kind == "thinking":
        for piece in chunks(block["thinking"]):
            yield delta({"type": "thinking_delta", "thinking": piece})
        yield delta({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        for piece in chunks(block["text"]):
            yield delta({"type": "text_delta", "text": piece})
    else:
        for piece in chunks(orjson.dumps(block["input"]).decode()):
            yield delta({"type": "input_json_delta", "partial_json": piece})
    yield _frame("content_block_stop", {"type": "content_block_stop", "index": index})


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

    def stream(self, generation: Generation, request: ChatRequest) -> Iterator[bytes]:
        final = self.encode(generation, request)
        usage = final["usage"]
        start = {
            **final,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 0},
        }
        yield _frame("message_start", {"type": "message_start", "message": start})
        yield _frame("ping", {"type": "ping"})
        for index, block in enumerate(final["content"]):
            yield from _block_events(index, block)
        delta = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
        yield _frame("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        yield _frame("message_stop", {"type": "message_stop"})

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def stream_error(self, status: int, message: str) -> bytes:
        return _frame("error", self.error_body(status, message))
