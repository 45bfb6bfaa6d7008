"""Google Gemini codec (``/v1beta/models/{model}:generateContent``, ``:streamGenerateContent``, ``:countTokens``).

Decoding lives in :mod:`google_input`. An answer is one candidate whose ``parts`` are, in order: a thought part
``{text, thought: true}`` (when the model reasoned), a text part (when it wrote text), then one ``functionCall`` part
per tool call (``id`` = the backend's call id). When there was reasoning, the first part after the thought carries a
``thoughtSignature`` that seals the reasoning text (``common.seal_thought``): gemini CLI drops thought parts from its
history but keeps signatures, so the reasoning comes back. Tool calls finish with ``STOP`` (as Gemini does),
``length`` with ``MAX_TOKENS``.

The synthetic stream (``?alt=sse``) is ``data: {GenerateContentResponse}`` frames without ``[DONE]``: the thought
in chunks, the text in chunks, all function calls in one chunk; the last chunk also carries ``finishReason`` and
``usageMetadata``. Every frame has a non-empty part (gemini CLI rejects a chunk whose part is ``{text: ""}``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from polar_cli.errors import ProtocolError
from polar_cli.models import Provider
from polar_cli.proxy.codecs.base import Codec, Route
from polar_cli.proxy.codecs.common import chunks, load_arguments, new_id, seal_thought, stable_id
from polar_cli.proxy.codecs.google_input import decode_request
from polar_cli.proxy.sse import sse_event
from polar_cli.proxy.types import ChatRequest, Generation

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
    return stable_id("", generation.id)[:22] if generation.id else new_id("")[:22]


def _call_parts(generation: Generation) -> list[dict[str, Any]]:
    parts = []
    for k, call in enumerate(generation.tool_calls):
        fn = call.get("function") or {}
        call_id = call.get("id") or stable_id("call_", generation.id, k)
        parts.append(
            {"functionCall": {"id": call_id, "name": fn.get("name") or "", "args": load_arguments(fn.get("arguments"))}}
        )
    return parts


def _usage(generation: Generation) -> dict[str, int]:
    p, c = generation.prompt_tokens, generation.completion_tokens
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}


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
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
            "modelVersion": request.model,
            "responseId": response_id(generation),
        }

    def _finish(self, generation: Generation, response: dict[str, Any]) -> dict[str, Any]:
        response["candidates"][0]["finishReason"] = _FINISH.get(generation.finish_reason, "OTHER")
        response["usageMetadata"] = _usage(generation)
        return response

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

    def stream(self, generation: Generation, request: ChatRequest) -> Iterator[bytes]:
        pieces: list[list[dict[str, Any]]] = []
        reasoning = generation.reasoning
        if reasoning:
            pieces.extend([{"text": piece, "thought": True}] for piece in chunks(reasoning))
        thought_pieces = len(pieces)
        pieces.extend([{"text": piece}] for piece in chunks(generation.text))
        calls = _call_parts(generation)
        if calls:
            pieces.append(calls)
        if reasoning:
            first = pieces[thought_pieces] if len(pieces) > thought_pieces else pieces[-1]
            first[0]["thoughtSignature"] = seal_thought(reasoning)
        if not pieces:
            pieces.append([{"text": ""}])
        last = len(pieces) - 1
        for k, parts in enumerate(pieces):
            response = self._envelope(generation, request, parts)
            if k == last:
                self._finish(generation, response)
            yield sse_event(response)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        name = _STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": status, "message": message, "status": name}}

    def stream_error(self, status: int, message: str) -> bytes:
        return sse_event(self.error_body(status, message))
