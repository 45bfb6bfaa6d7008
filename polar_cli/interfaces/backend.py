"""Inference backend interface: where the proxy sends normalized requests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.interfaces.base import Component
from polar_cli.models.chat import ChatRequest, Generation, UpstreamStream


class BackendClient(ABC):
    """A live connection to one inference server (or a script), shared by every session of a proxy.

    ``generate`` returns the assistant message with exact token data, or raises BackendError (already retried where
    the failure was transient). Per-session hooks let a backend keep per-session state (the scripted backend's
    cursor); HTTP backends ignore them.

    ``session_options`` is the allow-list of what one session may pass to ``open_session``: a pydantic model
    (``extra="forbid"``), or None when sessions pass nothing. Sessions are created over HTTP by whoever holds the
    control token, so no per-session option may name a host path: files come only from the operator's configuration.
    """

    name: ClassVar[str] = ""
    session_options: ClassVar[type[BaseModel] | None] = None
    streams_token_ids: ClassVar[bool] = False
    """True when ``open_stream`` streams chunks with token ids (pass-through streaming); else streams are synthetic."""

    async def open_stream(self, request: ChatRequest, *, session_id: str) -> UpstreamStream:
        """Start a streaming generation (only where ``streams_token_ids``); raises BackendError before any chunk."""
        raise NotImplementedError(f"the {self.name} backend does not stream token ids")

    @abstractmethod
    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        """One non-streaming generation for ``request`` on behalf of ``session_id``."""

    @abstractmethod
    async def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens ``request`` would take (for provider count-tokens side endpoints)."""

    async def models(self) -> list[str]:
        """Model names the backend serves (for ``GET /v1/models``)."""
        return []

    async def preflight(self, timeout_s: float) -> None:  # noqa: B027 - optional hook
        """Check within ``timeout_s`` that the backend answers, before any session starts; BackendError naming the
        server and the whole cause when it does not (default: nothing to check)."""

    async def open_session(self, session_id: str, options: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """A session was created; ``options`` are what it passed, already checked against ``session_options``."""

    async def close_session(self, session_id: str) -> None:  # noqa: B027 - optional hook
        """A session was removed; forget its state."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the client is not used afterwards."""


class InferenceBackend(Component):
    """An inference server family (vLLM, SGLang, any OpenAI-compatible server, scripted)."""

    kind: ClassVar[str] = "backend"

    @abstractmethod
    def client(self, **config: Any) -> BackendClient:
        """Validate ``config`` (ConfigError names the bad field) and create a client; no I/O happens here."""
