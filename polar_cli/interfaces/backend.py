"""Inference backend interface: where the proxy sends normalized requests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.errors import BackendError
from polar_cli.interfaces.base import Component
from polar_cli.models.chat import ChatRequest, Generation, Rendered, UpstreamStream
from polar_cli.models.inference import LogprobsMode


def no_token_in(name: str) -> str:
    return (f"the {name} backend has no token-in route: token mode (agent.token_mode: tokens) needs the vllm backend "
            "(served with --enable-scale-out) or the scripted backend")  # fmt: skip


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
    logprobs_mode: LogprobsMode | None = None
    """Which distribution the server's logprobs come from (None: unknown, or no logprobs); recorded per completion."""
    token_in: ClassVar[bool] = False
    """True when ``generate`` takes a request's ``token_prompt`` (token mode) and ``render`` renders prompts."""
    reloads_weights: ClassVar[bool] = False
    """True when ``reload_weights`` is implemented: a pool whose replicas cannot reload refuses ``load_weights``
    before pausing anything."""

    async def render(self, request: ChatRequest, *, add_generation_prompt: bool = True) -> Rendered:
        """The prompt ids the server's chat template makes of ``request`` (token mode); BackendError when the
        backend cannot render."""
        raise BackendError(no_token_in(self.name or type(self).__name__), status=409)

    async def check_token_in(self, timeout_s: float) -> None:
        """Token mode's backend check: the server has its token-in routes (BackendError naming what is missing)."""
        if not self.token_in:
            raise BackendError(no_token_in(self.name or type(self).__name__), status=409)

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

    async def context_tokens(self) -> int | None:
        """The served model's context length in tokens, when the backend knows it (the proxy's prompt budget,
        :mod:`polar_cli.proxy.budget`); None: unknown."""
        return None

    async def preflight(self, timeout_s: float) -> None:  # noqa: B027 - optional hook
        """Check within ``timeout_s`` that the backend answers, before any session starts; BackendError naming the
        server and the whole cause when it does not (default: nothing to check)."""

    async def open_session(self, session_id: str, options: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """A session was created; ``options`` are what it passed, already checked against ``session_options``."""

    async def close_session(self, session_id: str) -> None:  # noqa: B027 - optional hook
        """A session was removed; forget its state."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the client is not used afterwards."""

    # ---- weight updates (issue 20): what the inference pool asks of one server --------------------------------------

    async def pause_generation(self, timeout_s: float) -> bool:
        """Freeze the requests in flight on the server, to finish after ``resume_generation`` (a keep-mode pause:
        vLLM ``POST /pause?mode=keep``); False when the server has no such pause (its calls then just run on)."""
        return False

    async def resume_generation(self, timeout_s: float) -> None:  # noqa: B027 - optional hook
        """Undo ``pause_generation``."""

    async def reload_weights(self, path: str, timeout_s: float) -> None:
        """Reload the server's weights in place from ``path`` (a path on the server's machine), with the server's own
        mechanism (vLLM: ``reload_weights`` through ``/collective_rpc``; SGLang: ``/update_weights_from_disk``);
        BackendError naming the server when it cannot."""
        raise BackendError(f"the {self.name or type(self).__name__} backend cannot load weights from disk", status=400)


class InferenceBackend(Component):
    """An inference server family (vLLM, SGLang, any OpenAI-compatible server, scripted)."""

    kind: ClassVar[str] = "backend"

    @abstractmethod
    def client(self, **config: Any) -> BackendClient:
        """Validate ``config`` (ConfigError names the bad field) and create a client; no I/O happens here."""
