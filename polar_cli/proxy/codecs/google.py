"""Google Gemini codec (``/v1beta/models/{model}:generateContent``, ``:streamGenerateContent``, ``:countTokens``).

Decoding lives in :mod:`google_input`. An answer is one candidate whose ``parts`` are, in order: a thought part
``{text, thought: true}`` (when the model reasoned), a text part (when it wrote text), then one ``functionCall`` part
per tool call (``id`` = the backend's call id). When there was reasoning, the first part after the thought carries a
``thoughtSignature`` that seals the reasoning text (``common.seal_thought``): gemini CLI drops thought parts from its
history but keeps signatures, so the reasoning comes back. Tool calls finish with ``STOP`` (as Gemini does),
``length`` with ``MAX_TOKENS``.

A stream (``?alt=sse``) is ``data: {GenerateContentResponse}`` frames without ``[DONE]``: the thought in chunks, the
text in chunks, each sent as it arrives, then a last chunk with ``finishReason`` and ``usageMetadata`` that holds all
function calls, or ``{text: ""}`` when there are none (as Gemini's own last chunk; gemini CLI reads its finishReason
and skips the empty part).
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar_cli.errors import ProtocolError
from polar_cli.models import Provider
from polar_cli.models.chat import ChatRequest, Generation, StreamDelta, StreamStart
from polar_cli.proxy.codecs.base import Codec, Route, StreamEncoder
from polar_cli.proxy.codecs.common import chunks, load_arguments, new_id, seal_thought, stable_id
from polar_cli.proxy.codecs.google_input import decode_request
from polar_cli.proxy.sse import sse_event

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _model(route: Route, body: dict[str, Any]) -> str:
    model = route.model or body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("the model must be named in the path: /v1beta/models/{model}:generateContent")
    return model.removeprefix("models/")


def response_id(generation: Generation) -> str:
    return _response_id(generation.id)


def _response_id(generation_id: str) -> str:
    return stable_id("", generation_id)[:22] if generation_id else new_id("")[:22]


def envelope(rid: str, request: ChatRequest, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
        "modelVersion": request.model,
        "responseId": rid,
    }


def with_finish(generation: Generation, response: dict[str, Any]) -> dict[str, Any]:
    response["candidates"][0]["finishReason"] = _FINISH.get(generation.finish_reason, "OTHER")
    response["usageMetadata"] = _usage(generation)
    return response


def _call_parts(generation: Generation) -> list[dict[str, Any]]:
    return call_parts(generation.id, generation.tool_calls)


def call_parts(generation_id: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    parts = []
    for k, call in enumerate(calls):
        fn = call.get("function") or {}
        call_id = call.get("id") or stable_id("call_", generation_id, k)
        parts.append(
            {"functionCall": {"id": call_id, "name": fn.get("name") or "", "args": load_arguments(fn.get("arguments"))}}
        )
    return parts


def _usage(generation: Generation) -> dict[str, int]:
    p, c = generation.prompt_tokens, generation.completion_tokens
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}


class GoogleStreamEncoder(StreamEncoder):
    """``data: {GenerateContentResponse}`` frames, each sent as soon as its piece arrives: thought pieces, text
    pieces, then the closing frame with ``finishReason`` and ``usageMetadata``. That frame holds all function calls
    (their arguments are complete only at the end) or, when the answer has none, one ``{text: ""}`` part, as Gemini's
    own last chunk does. The thought signature rides on the first part after the thought."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.generation_id = ""
        self.rid = ""
        self.thought: list[str] = []
        self.sealed = False
        self.calls: dict[int, dict[str, Any]] = {}

    def open(self, start: StreamStart) -> bytes:
        self.generation_id = start.id
        self.rid = _response_id(start.id)
        return b""

    def _frame(self, parts: list[dict[str, Any]]) -> bytes:
        return sse_event(envelope(self.rid, self.request, parts))

    def _seal(self, part: dict[str, Any]) -> None:
        if self.thought and not self.sealed:
            part["thoughtSignature"] = seal_thought("".join(self.thought))
            self.sealed = True

    def delta(self, delta: StreamDelta) -> bytes:
        out = b""
        if delta.reasoning:
            self.thought.append(delta.reasoning)
            for piece in chunks(delta.reasoning):
                out += self._frame([{"text": piece, "thought": True}])
        for piece in chunks(delta.content):
            part = {"text": piece}
            self._seal(part)
            out += self._frame([part])
        for fragment in delta.tool_calls:
            fn = fragment.get("function") or {}
            call = self.calls.setdefault(
                int(fragment.get("index") or 0), {"id": None, "function": {"name": None, "arguments": ""}}
            )
            call["id"] = call["id"] or fragment.get("id")
            call["function"]["name"] = call["function"]["name"] or fn.get("name")
            call["function"]["arguments"] += fn.get("arguments") or ""
        return out

    def close(self, generation: Generation) -> bytes:
        if self.calls:
            parts = call_parts(self.generation_id, [c for _, c in sorted(self.calls.items())])
        else:
            parts = [{"text": ""}]
        self._seal(parts[0])
        return sse_event(with_finish(generation, envelope(self.rid, self.request, parts)))


class GoogleCodec(Codec):
    """Gemini generateContent ⇄ normalized chat."""

    provider: ClassVar[Provider] = "google"

    def decode(self, body: dict[str, Any], route: Route) -> ChatRequest:
        return decode_request(body, _model(route, body), stream=route.action == "streamGenerateContent")

    def decode_count_tokens(self, body: dict[str, Any], route: Route) -> ChatRequest:
        inner = body.get("generateContentRequest") or body.get("generate_content_request")
        if inner is not None:
            if not isinstance(inner, dict):
                raise ProtocolError("'generateContentRequest' must be an object")
            body = inner
        return decode_request(body, _model(route, body), stream=False, count_only=True)

    def count_tokens_body(self, count: int) -> dict[str, Any]:
        return {"totalTokens": count}

    def _envelope(self, generation: Generation, request: ChatRequest, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return envelope(response_id(generation), request, parts)

    def _finish(self, generation: Generation, response: dict[str, Any]) -> dict[str, Any]:
        return with_finish(generation, response)

    def encode(self, generation: Generation, request: ChatRequest) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        reasoning = generation.reasoning
        if reasoning:
            parts.append({"text": reasoning, "thought": True})
        if generation.text:
            parts.append({"text": generation.text})
        parts.extend(_call_parts(generation))
        if reasoning:
            # the signature rides on the first part a client keeps (the thought itself when it is alone)
            parts[1 if len(parts) > 1 else 0]["thoughtSignature"] = seal_thought(reasoning)
        if not parts:
            parts.append({"text": ""})
        return self._finish(generation, self._envelope(generation, request, parts))

    def encoder(self, request: ChatRequest) -> GoogleStreamEncoder:
        return GoogleStreamEncoder(request)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        name = _STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": status, "message": message, "status": name}}

    def stream_error(self, status: int, message: str) -> bytes:
        return sse_event(self.error_body(status, message))
