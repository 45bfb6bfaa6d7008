"""Checking a replayed call against the original: what a request must be, and where two requests first differ.

A replay (``polar replay``, :mod:`polar_cli.replay`) writes each original request into its script turn's ``expect``;
the scripted backend compares every replayed request with it. What legitimately differs between two runs of one task
is the session itself: its id, and the paths built from it (a harness's working directory in its system prompt). Both
sides are compared with every word holding the session id replaced by :data:`SESSION_PATH`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
from pydantic import Field

from polar_cli.models import StrictModel

SESSION_PATH = "<session path>"
"""What a word (up to whitespace or a quote) holding a session's id reads as, on both sides of a comparison."""


class ExpectedRequest(StrictModel):
    """A script turn's ``expect``: the original call's normalized request."""

    messages: list[dict[str, Any]] = Field(description="the request messages, the session's paths masked")
    tools_sha256: str | None = Field(default=None, description="sha256 of the tool definitions (canonical JSON)")


def mask_session(value: Any, session_id: str) -> Any:
    """``value`` (JSON data) with every word holding ``session_id`` replaced by :data:`SESSION_PATH`."""
    word = re.compile(rf"[^\s\"'`]*{re.escape(session_id)}[^\s\"'`]*")

    def mask(item: Any) -> Any:
        if isinstance(item, str):
            return word.sub(SESSION_PATH, item) if session_id in item else item
        if isinstance(item, list):
            return [mask(x) for x in item]
        if isinstance(item, dict):
            return {k: mask(v) for k, v in item.items()}
        return item

    return mask(value)


def tools_digest(tools: list[dict[str, Any]] | None) -> str | None:
    """sha256 of the tool definitions as canonical JSON (sorted keys); None without tools."""
    if not tools:
        return None
    return hashlib.sha256(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _brief(value: Any, limit: int = 160) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_difference(expected: Any, actual: Any, where: str) -> str:
    """Where two JSON values first differ, as ``where.key[i]: original X, replay Y``."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in [*expected, *(k for k in actual if k not in expected)]:
            if expected.get(key) != actual.get(key):
                return _first_difference(expected.get(key), actual.get(key), f"{where}.{key}")
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    return f"{where}: original {_brief(expected)}, replay {_brief(actual)}"


def messages_divergence(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> str | None:
    """Where ``actual`` request messages first differ from ``expected`` ones, or None when they are equal."""
    for i, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            role = a.get("role", "?") if isinstance(a, dict) else "?"
            return _first_difference(a, b, f"message {i} ({role})")
    if len(expected) != len(actual):
        return f"the request has {len(actual)} messages, the original had {len(expected)}"
    return None


def divergence(expected: ExpectedRequest, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None) -> str | None:  # fmt: skip
    """Where a request (its session's paths already masked) differs from ``expected``, or None."""
    diverged = messages_divergence(expected.messages, messages)
    if diverged is None and expected.tools_sha256 is not None and tools_digest(tools) != expected.tools_sha256:
        diverged = "the tool definitions differ from the original's"
    return diverged
