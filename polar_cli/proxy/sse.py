"""Server-sent events framing shared by every provider's synthetic stream."""

from __future__ import annotations

from typing import Any

import orjson


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One SSE frame: optional ``event:`` line, one ``data:`` line (JSON unless already a string), blank line."""
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
