"""Capture: one generation call becomes one Completion record (built as a plain dict, from a checked Generation).

``check_generation`` is the gate in front of the journal: whatever a backend returned, a record is only built from
token ids that are ints, logprobs that are finite floats one per response token, and a message that is an object. An
answer that fails it is a BackendError (502): the harness gets a provider-shaped error and nothing is journaled, so
a journal never holds a line its readers would reject. The checks are linear scans in C or over the (short) response;
the prompt ids vLLM sends as JSON text are checked as bytes, never parsed (:mod:`polar_cli.proxy.token_json`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import orjson

from polar_cli.errors import BackendError
from polar_cli.models import Provider
from polar_cli.models.chat import ChatRequest, Generation, JsonTokenIds, StreamMode
from polar_cli.proxy.token_json import json_ids_ok

Delivery = Literal["answered", "client_gone", "aborted"]
"""``answered``: the line was flushed, then the answer was handed to the client's connection. ``client_gone``: the
backend's answer was complete, but the client had disconnected before it could be sent. ``aborted``: a pass-through
stream's client disconnected mid-answer, the upstream was stopped, and the record holds what was sampled until then
(finish_reason ``abort``: not training data)."""


def _bad(what: str) -> BackendError:
    return BackendError(f"the backend answered invalid token data: {what}; the call was not recorded")


def _ids_ok(ids: Any) -> bool:
    return isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)


def check_generation(generation: Generation) -> None:
    """BackendError (502) unless the generation's token data can be journaled and read back as a Completion."""
    prompt = generation.prompt_ids
    if isinstance(prompt, JsonTokenIds):
        if not json_ids_ok(prompt):
            raise _bad("prompt_ids is not a JSON array of token ids")
    elif not _ids_ok(prompt):
        raise _bad("prompt_ids must be a list of non-negative ints")
    ids = generation.response_ids
    if not _ids_ok(ids):
        raise _bad("response_ids must be a list of non-negative ints")
    n = len(ids)
    logprobs = generation.response_logprobs
    if logprobs is not None:
        if not isinstance(logprobs, list) or len(logprobs) != n:
            raise _bad(f"response_logprobs must be a list of {n} floats, one per response token")
        if not all(type(x) is float and math.isfinite(x) for x in logprobs):
            raise _bad("response_logprobs must be finite floats")
    tokens = generation.response_tokens
    if tokens is not None and (
        not isinstance(tokens, list) or len(tokens) != n or not all(type(t) is str for t in tokens)
    ):
        raise _bad(f"response_tokens must be a list of {n} strings")
    if not isinstance(generation.message, dict):
        raise _bad("the assistant message is not an object")


def completion_record(
    *,
    session_id: str,
    index: int,
    provider: Provider,
    body: dict[str, Any],
    request: ChatRequest,
    generation: Generation,
    started_at: float,
    finished_at: float,
    path: str,
    raw_body: bytes | None = None,
    delivery: Delivery = "answered",
    stream_mode: StreamMode | None = None,
) -> dict[str, Any]:
    """The Completion fields for one call, ready for orjson.

    Bulky parts the proxy already holds as JSON text (the harness's request body, vLLM's prompt ids) go in as
    ``orjson.Fragment`` and are written verbatim, not re-serialized.
    """
    request_value: Any = body
    if raw_body is not None and b"\n" not in raw_body and b"\r" not in raw_body:
        request_value = orjson.Fragment(raw_body)
    prompt_ids = generation.prompt_ids
    prompt_value: Any = orjson.Fragment(prompt_ids.raw) if isinstance(prompt_ids, JsonTokenIds) else prompt_ids
    return {
        "completion_id": f"{session_id}-{index}",
        "session_id": session_id,
        "index": index,
        "provider": provider,
        "model": generation.model or request.model,
        "request": request_value,
        "request_messages": request.messages,
        "request_tools": request.tools,
        "request_params": request.params,
        "response_message": generation.message,
        "prompt_ids": prompt_value,
        "response_ids": generation.response_ids,
        "response_logprobs": generation.response_logprobs,
        "response_tokens": generation.response_tokens,
        "finish_reason": generation.finish_reason,
        "token_source": generation.token_source,
        "backend": generation.backend,
        "started_at": started_at,
        "finished_at": finished_at,
        "backend_seconds": generation.backend_seconds,
        "policy_version": generation.policy_version,
        "version_spans": [s.model_dump() for s in generation.version_spans] if generation.version_spans else None,
        "replica": generation.replica,
        "logprobs_mode": generation.logprobs_mode,
        "metadata": {
            "path": path,
            "stream": request.stream,
            "stream_mode": stream_mode if request.stream else None,
            "generation_id": generation.id,
            "requested_model": request.model,
            "tool_choice": request.tool_choice,
            "delivery": delivery,
        },
    }
