"""OpenAI Responses API codec (``POST /v1/responses``): what Codex CLI speaks, and only this.

Decoding lives in :mod:`openai_responses_input` (items) and :mod:`openai_responses_tools` (tools).
Encoding turns one :class:`Generation` into a Response object whose ``output`` is, in order: a ``reasoning`` item
(when the model reasoned), a ``message`` item (when it wrote text, or when nothing else was produced), then one
``function_call`` / ``custom_tool_call`` / ``tool_search_call`` item per tool call. The synthetic
stream replays that Response as the API's events, each with ``event:`` and a ``sequence_number`` counting from 0:
``response.created``, ``response.in_progress``, per item ``response.output_item.added`` … its part/delta/done events …
``response.output_item.done`` (with the complete item: Codex reads items only there), then ``response.completed``
(``response.incomplete`` when the backend stopped at its token limit). There is no ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import orjson

from polar_cli.models import Provider
from polar_cli.proxy.codecs.base import Codec, Route
from polar_cli.proxy.codecs.common import chunks, seal_thought, stable_id
from polar_cli.proxy.codecs.openai_responses_input import decode_request
from polar_cli.proxy.codecs.openai_responses_tools import TOOL_SEARCH, custom_input
from polar_cli.proxy.types import ChatRequest, Generation

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_ERROR_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}


class OpenAIResponsesCodec(Codec):
    """Responses API ⇄ normalized chat."""

    provider: ClassVar[Provider] = "openai_responses"

    def decode(self, body: dict[str, Any], route: Route) -> ChatRequest:
        return decode_request(body)

    def encode(self, generation: Generation, request: ChatRequest) -> dict[str, Any]:
        response = _response_shell(generation, request)
        status, incomplete = _status(generation)
        response.update(
            status=status,
            incomplete_details=incomplete,
            output=output_items(generation, request),
            usage=_usage(generation),
        )
        return response

    def stream(self, generation: Generation, request: ChatRequest) -> Iterator[bytes]:
        final = self.encode(generation, request)
        seq = _Sequence()
        shell = {**final, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
        yield seq.event("response.created", response=shell)
        yield seq.event("response.in_progress", response=shell)
        for index, item in enumerate(final["output"]):
            yield from _item_events(seq, index, item)
        terminal = "response.completed" if final["status"] == "completed" else "response.incomplete"
        yield seq.event(terminal, response=final)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        error = {"message": message, "type": _error_type(status), "param": None, "code": _code(status, message)}
        return {"error": error}

    def stream_error(self, status: int, message: str) -> bytes:
        """``response.created`` then ``response.failed`` carrying ``response.error``.

        Codex maps ``response.failed`` errors to its retry/context-window logic (it ignores a bare ``error`` event),
        and the SDK's stream helper needs ``response.created`` first. The proxy streams only after the backend
        answered, so an error is always the first thing in its stream and the sequence starts at 0.
        """
        seq = _Sequence()
        response = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "model": "",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
        }
        created = seq.event("response.created", response=response)
        error = {"code": _code(status, message) or "server_error", "message": message}
        return created + seq.event("response.failed", response={**response, "status": "failed", "error": error})

    def count_tokens_body(self, count: int) -> dict[str, Any]:
        """``POST /v1/responses/input_tokens`` answer."""
        return {"object": "response.input_tokens", "input_tokens": count}


def output_items(generation: Generation, request: ChatRequest) -> list[dict[str, Any]]:
    """The Response ``output`` list for a generation (complete items, as in ``output_item.done``)."""
    base = _base_id(generation)
    status = "incomplete" if generation.finish_reason in _INCOMPLETE else "completed"
    items: list[dict[str, Any]] = []
    reasoning = generation.reasoning
    if reasoning:
        item: dict[str, Any] = {
            "id": f"rs_{base}",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": reasoning}],
        }
        if request.context.get("encrypted_reasoning"):
            item["encrypted_content"] = seal_thought(reasoning)
        items.append(item)
    calls = generation.tool_calls
    if generation.text or not calls:
        part = {"type": "output_text", "text": generation.text, "annotations": [], "logprobs": []}
        items.append({"id": f"msg_{base}", "type": "message", "status": status, "role": "assistant", "content": [part]})
    custom = request.context.get("custom_tools") or {}
    namespaced = request.context.get("namespaced") or {}
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else ""
        call_id = call.get("id") or f"call_{base}_{index}"
        if name in custom:
            items.append(
                {
                    "id": f"ctc_{base}_{index}",
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": call_id,
                    "name": name,
                    "input": custom_input(arguments),
                }
            )
        elif name == TOOL_SEARCH and request.context.get("tool_search"):
            items.append(
                {
                    "id": f"tsc_{base}_{index}",
                    "type": "tool_search_call",
                    "status": "completed",
                    "call_id": call_id,
                    "execution": "client",
                    "arguments": _json_object(arguments),
                }
            )
        else:
            items.append(
                {
                    "id": f"fc_{base}_{index}",
                    "type": "function_call",
                    "status": "completed",
                    "arguments": arguments,
                    "call_id": call_id,
                    "name": name,
                }
            )
        if name in namespaced:
            items[-1]["namespace"] = namespaced[name]
    return items


# --- stream events ------------------------------------------------------------------------------------------------


class _Sequence:
    """Numbers the events of one stream."""

    def __init__(self) -> None:
        self.number = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.number}
        self.number += 1
        # same framing as sse.sse_event, built as bytes: events carry the whole Response (tools included) three times
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _item_events(seq: _Sequence, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    kind, item_id = item["type"], item["id"]
    at = {"item_id": item_id, "output_index": index}
    if kind == "reasoning":
        yield seq.event("response.output_item.added", output_index=index, item={**item, "summary": []})
        for s_index, summary in enumerate(item["summary"]):
            text = summary["text"]
            yield seq.event(
                "response.reasoning_summary_part.added",
                **at,
                summary_index=s_index,
                part={"type": "summary_text", "text": ""},
            )
            for piece in chunks(text):
                yield seq.event("response.reasoning_summary_text.delta", **at, summary_index=s_index, delta=piece)
            yield seq.event("response.reasoning_summary_text.done", **at, summary_index=s_index, text=text)
            yield seq.event(
                "response.reasoning_summary_part.done",
                **at,
                summary_index=s_index,
                part={"type": "summary_text", "text": text},
            )
    elif kind == "message":
        added = {**item, "status": "in_progress", "content": []}
        yield seq.event("response.output_item.added", output_index=index, item=added)
        for c_index, part in enumerate(item["content"]):
            text = part["text"]
            yield seq.event("response.content_part.added", **at, content_index=c_index, part={**part, "text": ""})
            for piece in chunks(text):
                yield seq.event("response.output_text.delta", **at, content_index=c_index, delta=piece, logprobs=[])
            yield seq.event("response.output_text.done", **at, content_index=c_index, text=text, logprobs=[])
            yield seq.event("response.content_part.done", **at, content_index=c_index, part=part)
    elif kind == "function_call":
        arguments = item["arguments"]
        yield seq.event(
            "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""}
        )
        for piece in chunks(arguments):
            yield seq.event("response.function_call_arguments.delta", **at, delta=piece)
        yield seq.event("response.function_call_arguments.done", **at, arguments=arguments)
    elif kind == "custom_tool_call":
        text = item["input"]
        yield seq.event(
            "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "input": ""}
        )
        for piece in chunks(text):
            yield seq.event("response.custom_tool_call_input.delta", **at, delta=piece)
        yield seq.event("response.custom_tool_call_input.done", **at, input=text)
    else:  # tool_search_call: no delta events exist for it
        yield seq.event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
    yield seq.event("response.output_item.done", output_index=index, item=item)


# --- response object ----------------------------------------------------------------------------------------------


def _response_shell(generation: Generation, request: ChatRequest) -> dict[str, Any]:
    echo = request.context.get("echo") or {}
    return {
        "id": f"resp_{_base_id(generation)}",
        "object": "response",
        "created_at": generation.created or int(time.time()),
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "metadata": echo.get("metadata") or {},
        "model": request.model,
        "output": [],
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": echo.get("prompt_cache_key"),
        "reasoning": echo.get("reasoning") or {"effort": None, "summary": None},
        "store": echo.get("store", False),
        "temperature": echo.get("temperature"),
        "text": echo.get("text") or {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice") or "auto",
        "tools": echo.get("tools") or [],
        "top_p": echo.get("top_p"),
        "truncation": echo.get("truncation") or "disabled",
        "usage": None,
        "user": echo.get("user"),
    }


def _json_object(arguments: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _status(generation: Generation) -> tuple[str, dict[str, str] | None]:
    reason = _INCOMPLETE.get(generation.finish_reason)
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def _usage(generation: Generation) -> dict[str, Any]:
    prompt, completion = generation.prompt_tokens, generation.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},  # the backend does not split reasoning from answer tokens
        "total_tokens": prompt + completion,
    }


def _base_id(generation: Generation) -> str:
    """The id stem of a generation's response and items (stable, so the JSON answer and the stream agree)."""
    return stable_id("", generation.id) if generation.id else uuid.uuid4().hex[:24]


def _error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _code(status: int, message: str) -> str | None:
    lowered = message.lower()
    if status == 400 and ("context length" in lowered or "context window" in lowered or "too many tokens" in lowered):
        return "context_length_exceeded"  # Codex stops retrying and reports (or compacts) on this code
    if status >= 500:
        return "server_error"
    return _ERROR_CODES.get(status)
