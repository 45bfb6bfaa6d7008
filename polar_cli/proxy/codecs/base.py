"""The provider codec interface: one module per provider protocol implements it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from polar_cli.models import Provider
from polar_cli.models.chat import ChatRequest, Generation, StreamDelta, StreamStart


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


class StreamEncoder(ABC):
    """Encodes one answer as the provider's SSE events, piece by piece: ``open`` once, ``delta`` per upstream piece,
    ``close`` with the finished generation. The synthetic stream and the pass-through pump both drive it."""

    @abstractmethod
    def open(self, start: StreamStart) -> bytes:
        """The events before any content (role chunk, message_start ...)."""

    @abstractmethod
    def delta(self, delta: StreamDelta) -> bytes:
        """The events for one piece of reasoning, text or tool call."""

    @abstractmethod
    def close(self, generation: Generation) -> bytes:
        """The closing events (finish reason, usage, terminator) once the whole generation is known."""


def replay(encoder: StreamEncoder, generation: Generation) -> Iterator[bytes]:
    """The synthetic stream: a whole generation driven through an incremental encoder as a few big pieces."""
    start = StreamStart(generation.id, generation.created, generation.model, generation.prompt_tokens)
    yield encoder.open(start)
    for delta in StreamDelta.pieces_of(generation):
        out = encoder.delta(delta)
        if out:
            yield out
    yield encoder.close(generation)


class Codec(ABC):
    """Translates one provider protocol to and from the normalized chat shape."""

    provider: ClassVar[Provider]

    @abstractmethod
    def decode(self, body: dict[str, Any], route: Route) -> ChatRequest:
        """Normalize a generation request; raise ProtocolError (a provider-shaped 400) when it is malformed."""

    @abstractmethod
    def encode(self, generation: Generation, request: ChatRequest) -> dict[str, Any]:
        """The non-streaming response body, exactly in the provider's shape."""

    def encoder(self, request: ChatRequest) -> StreamEncoder | None:
        """The incremental stream encoder for ``request``; None where the codec only has a synthetic stream."""
        return None

    def stream(self, generation: Generation, request: ChatRequest) -> Iterator[bytes]:
        """The synthetic SSE stream for the same answer, in the provider's exact event order."""
        encoder = self.encoder(request)
        if encoder is None:
            raise NotImplementedError(f"{type(self).__name__} has neither stream() nor encoder()")
        return replay(encoder, generation)

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
