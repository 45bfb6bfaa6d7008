"""The provider codec interface: one module per provider protocol implements it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from polar_cli.models import Provider
from polar_cli.proxy.types import ChatRequest, Generation


@dataclass
class Route:
    """What the URL said about a request, after the session prefix is stripped.

    ``path`` starts with ``/`` (e.g. ``/v1/messages``, ``/v1beta/models/gemini-x:streamGenerateContent``);
    ``model`` is the model named in the path (Google), ``action`` the Google method (``generateContent``,
    ``streamGenerateContent``, ``countTokens``); ``query`` the query parameters.
    """

    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    action: str | None = None


class Codec(ABC):
    """Translates one provider protocol to and from the normalized chat shape."""

    provider: ClassVar[Provider]

    @abstractmethod
    def decode(self, body: dict[str, Any], route: Route) -> ChatRequest:
        """Normalize a generation request; raise ProtocolError (a provider-shaped 400) when it is malformed."""

    @abstractmethod
    def encode(self, generation: Generation, request: ChatRequest) -> dict[str, Any]:
        """The non-streaming response body, exactly in the provider's shape."""

    @abstractmethod
    def stream(self, generation: Generation, request: ChatRequest) -> Iterator[bytes]:
        """The synthetic SSE stream for the same answer, in the provider's exact event order."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """A provider-shaped error body for an HTTP error response."""

    @abstractmethod
    def stream_error(self, status: int, message: str) -> bytes:
        """A provider-shaped error event for a stream that has already started."""

    def decode_count_tokens(self, body: dict[str, Any], route: Route) -> ChatRequest:
        """Normalize a token-count side request (Anthropic ``count_tokens``, Google ``countTokens``)."""
        return self.decode(body, route)

    def count_tokens_body(self, count: int) -> dict[str, Any]:
        """The provider's token-count answer; codecs without a count endpoint keep this default."""
        return {"input_tokens": count}
