"""Saving the request bodies a harness really sent (``polar doctor --save-requests``) as small test fixtures.

Long texts (system prompts, tool descriptions) are shortened; structure, tools and every field are kept, so a codec
test meets exactly the shapes the CLI sends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LIMIT = 240


def shorten(value: Any, limit: int = LIMIT) -> Any:
    """``value`` with every string longer than ``limit`` cut to ``limit`` characters plus a marker."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"...[polar: shortened from {len(value)} chars]"
    if isinstance(value, dict):
        return {key: shorten(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [shorten(item, limit) for item in value]
    return value


def save_requests(directory: Path, harness: str, version: str, requests: Sequence[Any]) -> list[Path]:
    """One file per generation call (``.method .path .provider .body``): ``<directory>/<harness>/turn<N>.json``."""
    target = directory / harness
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for index, request in enumerate(requests, start=1):
        path, _, query = request.path.partition("?")
        body = request.body or {}
        fixture = {
            "harness": harness,
            "version": version,
            "provider": request.provider,
            "path": path,
            "query": dict(pair.split("=", 1) if "=" in pair else (pair, "") for pair in query.split("&") if pair),
            "stream": bool(body.get("stream")) or "streamGenerateContent" in path,
            "body": shorten(body),
        }
        out = target / f"turn{index}.json"
        out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        written.append(out)
    return written
