"""Capture: one generation call becomes one Completion record (built as a plain dict: it is our own trusted data)."""

from __future__ import annotations

from typing import Any

import orjson

from polar_cli.models import Provider
from polar_cli.proxy.types import ChatRequest, Generation, JsonTokenIds


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
        "metadata": {
            "path": path,
            "stream": request.stream,
            "generation_id": generation.id,
            "requested_model": request.model,
            "tool_choice": request.tool_choice,
        },
    }

