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
from typing import Any, ClassVar

import orjson

from polar_cli.models import Provider
from polar_cli.models.chat import ChatRequest, Generation, StreamDelta, StreamStart
from polar_cli.proxy.codecs.base import Codec, Route, StreamEncoder
from polar_cli.proxy.codecs.common import chunks, seal_thought, stable_id
from polar_cli.proxy.codecs.openai_responses_input import decode_request
from polar_cli.proxy.codecs.openai_responses_tools import TOOL_SEARCH, custom_input

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
        response = _response_shell(_base_id(generation), generation.created, request)
        status, incomplete = _status(generation)
        response.update(
            status=status,
            incomplete_details=incomplete,
            output=output_items(generation, request),
            usage=_usage(generation),
        )
        return response

    def encoder(self, request: ChatRequest) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(request)

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
    items: list[dict[str, Any]] = []
    if generation.reasoning:
        items.append(reasoning_item(base, generation.reasoning, request))
    calls = generation.tool_calls
    if generation.text or not calls:
        items.append(message_item(base, generation.text, _item_status(generation.finish_reason)))
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        items.append(
            call_item(
                base,
                index,
                call.get("id"),
                str(function.get("name") or ""),
                arguments if isinstance(arguments, str) else "",
                request,
            )
        )
    return items


def _item_status(finish_reason: str) -> str:
    return "incomplete" if finish_reason in _INCOMPLETE else "completed"


def reasoning_item(base: str, text: str, request: ChatRequest) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": f"rs_{base}",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}],
    }
    if request.context.get("encrypted_reasoning"):
        item["encrypted_content"] = seal_thought(text)
    return item


def message_item(base: str, text: str, status: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {"id": f"msg_{base}", "type": "message", "status": status, "role": "assistant", "content": [part]}


def call_kind(name: str, request: ChatRequest) -> str:
    """The output item type a tool call of ``name`` is answered as."""
    if name in (request.context.get("custom_tools") or {}):
        return "custom_tool_call"
    if name == TOOL_SEARCH and request.context.get("tool_search"):
        return "tool_search_call"
    return "function_call"


def call_item(
    base: str, index: int, call_id: str | None, name: str, arguments: str, request: ChatRequest
) -> dict[str, Any]:
    call_id = call_id or f"call_{base}_{index}"
    kind = call_kind(name, request)
    item: dict[str, Any]
    if kind == "custom_tool_call":
        item = {
            "id": f"ctc_{base}_{index}",
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": name,
            "input": custom_input(arguments),
        }
    elif kind == "tool_search_call":
        item = {
            "id": f"tsc_{base}_{index}",
            "type": "tool_search_call",
            "status": "completed",
            "call_id": call_id,
            "execution": "client",
            "arguments": _json_object(arguments),
        }
    else:
        item = {
            "id": f"fc_{base}_{index}",
            "type": "function_call",
            "status": "completed",
            "arguments": arguments,
            "call_id": call_id,
            "name": name,
        }
    namespaced = request.context.get("namespaced") or {}
    if name in namespaced:
        item["namespace"] = namespaced[name]
    return item


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


class ResponsesStreamEncoder(StreamEncoder):
    """Responses events: ``response.created`` / ``response.in_progress``; one output item per kind of piece in arrival
    order (reasoning summary deltas; message text deltas, with logprobs when the request included
    ``message.output_text.logprobs``; function-call argument deltas; a custom tool call's input as one delta when it
    ends, since its freeform text is derived from the whole arguments), each ended by its done events and
    ``response.output_item.done`` with the complete item; an empty message when the answer had neither text nor tool
    calls; then ``response.completed`` (``response.incomplete`` at the token limit) with every item."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.want_logprobs = bool(request.context.get("logprobs"))
        self.seq = _Sequence()
        self.base = ""
        self.shell: dict[str, Any] = {}
        self.items: list[dict[str, Any]] = []
        self.kind: str | None = None  # the open item's type
        self.call: int | None = None
        self.call_id: str | None = None
        self.name = ""
        self.text: list[str] = []
        self.logprobs: list[Any] = []
        self.wrote_message = False
        self.wrote_call = False

    def open(self, start: StreamStart) -> bytes:
        self.base = stable_id("", start.id) if start.id else uuid.uuid4().hex[:24]
        self.shell = _response_shell(self.base, start.created, self.request)
        shell = {**self.shell, "status": "in_progress"}
        return self.seq.event("response.created", response=shell) + self.seq.event(
            "response.in_progress", response=shell
        )

    @property
    def _at(self) -> dict[str, Any]:
        return {"item_id": self._pending_id(), "output_index": len(self.items)}

    def _pending_id(self) -> str:
        if self.kind == "reasoning":
            return f"rs_{self.base}"
        if self.kind == "message":
            return f"msg_{self.base}"
        return call_item(self.base, self.call or 0, self.call_id, self.name, "", self.request)["id"]

    def _begin(self, kind: str, added: dict[str, Any]) -> bytes:
        out = self._end("completed")
        self.kind, self.text, self.logprobs = kind, [], []
        return out + self.seq.event("response.output_item.added", output_index=len(self.items), item=added)

    def _end(self, status: str) -> bytes:
        """The done events of the open item; ``status``: a message's, from the finish reason when it is the last."""
        if self.kind is None:
            return b""
        seq, at, text = self.seq, self._at, "".join(self.text)
        out = []
        if self.kind == "reasoning":
            item = reasoning_item(self.base, text, self.request)
            part = {"type": "summary_text", "text": text}
            out.append(seq.event("response.reasoning_summary_text.done", **at, summary_index=0, text=text))
            out.append(seq.event("response.reasoning_summary_part.done", **at, summary_index=0, part=part))
        elif self.kind == "message":
            item = message_item(self.base, text, status, self.logprobs)
            part = item["content"][0]
            out.append(seq.event("response.output_text.done", **at, content_index=0, text=text, logprobs=self.logprobs))
            out.append(seq.event("response.content_part.done", **at, content_index=0, part=part))
        else:
            item = call_item(self.base, self.call or 0, self.call_id, self.name, text, self.request)
            if self.kind == "function_call":
                out.append(seq.event("response.function_call_arguments.done", **at, arguments=text))
            elif self.kind == "custom_tool_call":
                for piece in chunks(item["input"]):
                    out.append(seq.event("response.custom_tool_call_input.delta", **at, delta=piece))
                out.append(seq.event("response.custom_tool_call_input.done", **at, input=item["input"]))
        out.append(seq.event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        self.kind = None
        return b"".join(out)

    def delta(self, delta: StreamDelta) -> bytes:
        out = b""
        if delta.reasoning:
            if self.kind != "reasoning":
                item = {"id": f"rs_{self.base}", "type": "reasoning", "summary": []}
                out += self._begin("reasoning", item)
                summary: dict[str, Any] = {"type": "summary_text", "text": ""}
                out += self.seq.event(
                    "response.reasoning_summary_part.added", **self._at, summary_index=0, part=summary
                )
            self.text.append(delta.reasoning)
            for piece in chunks(delta.reasoning):
                out += self.seq.event("response.reasoning_summary_text.delta", **self._at, summary_index=0, delta=piece)
        if delta.content:
            if self.kind != "message":
                added = {**message_item(self.base, "", "in_progress"), "content": []}
                out += self._begin("message", added)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out += self.seq.event("response.content_part.added", **self._at, content_index=0, part=part)
                self.wrote_message = True
            self.text.append(delta.content)
            logprobs = list(delta.logprobs) if self.want_logprobs else []
            self.logprobs += logprobs
            for n, piece in enumerate(chunks(delta.content)):
                out += self.seq.event(
                    "response.output_text.delta",
                    **self._at,
                    content_index=0,
                    delta=piece,
                    logprobs=logprobs if n == 0 else [],
                )
        for fragment in delta.tool_calls:
            index = int(fragment.get("index") or 0)
            fn = fragment.get("function") or {}
            if self.call != index or self.kind not in ("function_call", "custom_tool_call", "tool_search_call"):
                out += self._end("completed")
                self.call, self.call_id, self.name = index, fragment.get("id"), str(fn.get("name") or "")
                self.kind = call_kind(self.name, self.request)
                added = call_item(self.base, index, self.call_id, self.name, "", self.request)
                added["status"] = "in_progress"
                if self.kind == "custom_tool_call":
                    added["input"] = ""
                kind = self.kind
                self.kind = None
                out += self._begin(kind, added)
                self.wrote_call = True
            piece = fn.get("arguments") or ""
            self.text.append(piece)
            if piece and self.kind == "function_call":
                for bit in chunks(piece):
                    out += self.seq.event("response.function_call_arguments.delta", **self._at, delta=bit)
        return out

    def close(self, generation: Generation) -> bytes:
        status, incomplete = _status(generation)
        out = self._end(_item_status(generation.finish_reason))
        if not self.wrote_message and not self.wrote_call:
            added = {**message_item(self.base, "", "in_progress"), "content": []}
            out += self._begin("message", added)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self.seq.event("response.content_part.added", **self._at, content_index=0, part=part)
            out += self._end(_item_status(generation.finish_reason))
        final = {
            **self.shell,
            "status": status,
            "incomplete_details": incomplete,
            "output": self.items,
            "usage": _usage(generation),
        }
        terminal = "response.completed" if status == "completed" else "response.incomplete"
        return out + self.seq.event(terminal, response=final)


# --- response object ----------------------------------------------------------------------------------------------


def _response_shell(base: str, created: int, request: ChatRequest) -> dict[str, Any]:
    echo = request.context.get("echo") or {}
    return {
        "id": f"resp_{base}",
        "object": "response",
        "created_at": created or int(time.time()),
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
