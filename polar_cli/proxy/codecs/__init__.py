"""Provider codecs (one module per protocol) and detection by path, then headers.

The detection table maps a request path (after the ``/s/{id}`` session prefix) to what it is: a generation call, a
token count, a model listing, the base path, or unknown, and to the provider whose shape the answer takes. Codec
modules are imported lazily; a protocol whose module is missing answers 404 instead of breaking the others.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from polar_cli.models import Provider
from polar_cli.proxy.codecs.base import Codec, Route

CODEC_MODULES: dict[Provider, str] = {
    "anthropic": "polar_cli.proxy.codecs.anthropic",
    "openai_chat": "polar_cli.proxy.codecs.openai_chat",
    "openai_responses": "polar_cli.proxy.codecs.openai_responses",
    "google": "polar_cli.proxy.codecs.google",
}

Kind = Literal["generate", "count_tokens", "models", "base", "unknown"]

_EXACT: dict[str, tuple[Kind, Provider]] = {
    "/v1/messages": ("generate", "anthropic"),
    "/messages": ("generate", "anthropic"),
    "/v1/messages/count_tokens": ("count_tokens", "anthropic"),
    "/messages/count_tokens": ("count_tokens", "anthropic"),
    "/v1/chat/completions": ("generate", "openai_chat"),
    "/chat/completions": ("generate", "openai_chat"),
    "/v1/responses": ("generate", "openai_responses"),
    "/responses": ("generate", "openai_responses"),
}
_BASE_PATHS = frozenset({"", "/", "/v1", "/v1beta"})
_MODEL_LISTS = frozenset({"/v1/models", "/models", "/v1beta/models"})
_GOOGLE = re.compile(r"^/(?:v1beta|v1alpha|v1)/models/([^/:]+):([A-Za-z]+)$")
_GOOGLE_ACTIONS: dict[str, Kind] = {
    "generateContent": "generate",
    "streamGenerateContent": "generate",
    "countTokens": "count_tokens",
}


@dataclass
class Detected:
    kind: Kind
    provider: Provider
    route: Route


def provider_from_headers(headers: Mapping[str, str], query: Mapping[str, str]) -> Provider:
    """The provider whose shape an answer takes when the path alone does not say."""
    if "anthropic-version" in headers or "x-api-key" in headers:
        return "anthropic"
    if "x-goog-api-key" in headers or "key" in query:
        return "google"
    return "openai_chat"


def detect(method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str]) -> Detected:
    """Classify a proxied request by path, then headers. ``headers`` must have lower-case names."""
    path = path.rstrip("/") if len(path) > 1 else path
    route = Route(path=path, query=dict(query), headers=dict(headers))
    hit = _EXACT.get(path)
    if hit is not None:
        return Detected(hit[0] if method == "POST" else "unknown", hit[1], route)
    match = _GOOGLE.match(path)
    if match is not None:
        route.model, route.action = match.group(1), match.group(2)
        kind = _GOOGLE_ACTIONS.get(route.action, "unknown")
        return Detected(kind if method == "POST" else "unknown", "google", route)
    if method in ("GET", "HEAD") and path in _BASE_PATHS:
        return Detected("base", provider_from_headers(headers, query), route)
    if method == "GET" and path in _MODEL_LISTS:
        provider = "google" if path.startswith("/v1beta") else provider_from_headers(headers, query)
        return Detected("models", provider, route)
    return Detected("unknown", provider_from_headers(headers, query), route)


_codecs: dict[Provider, Codec | None] = {}


def get_codec(provider: Provider) -> Codec | None:
    """The codec instance for ``provider`` (the Codec subclass its module defines), or None if not installed."""
    if provider not in _codecs:
        module_name = CODEC_MODULES[provider]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            _codecs[provider] = None
            return None
        found = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Codec)
            and obj is not Codec
            and not inspect.isabstract(obj)
            and obj.__module__ == module_name
            and getattr(obj, "provider", None) == provider
        ]
        _codecs[provider] = found[0]() if found else None
    return _codecs[provider]


def available_providers() -> list[Provider]:
    return [p for p in CODEC_MODULES if get_codec(p) is not None]
