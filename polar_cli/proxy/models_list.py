"""``GET /v1/models`` (and Google's ``/v1beta/models``) answered in each provider's shape; never recorded."""

from __future__ import annotations

from typing import Any

from polar_cli.models import Provider


def models_body(provider: Provider, names: list[str]) -> dict[str, Any]:
    if provider == "anthropic":
        data = [{"type": "model", "id": n, "display_name": n, "created_at": "2025-01-01T00:00:00Z"} for n in names]
        return {
            "data": data,
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }
    if provider == "google":
        methods = ["generateContent", "streamGenerateContent", "countTokens"]
        return {
            "models": [{"name": f"models/{n}", "displayName": n, "supportedGenerationMethods": methods} for n in names]
        }
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "polar"} for n in names]}
