"""The served model's tokenizer, found without the user's help, for the builders' end-of-turn ids.

In order: the proxy's own ``tokenizer`` (``--tokenizer``), the scripted backend's demo tokenizer, or the inference
server's model: vLLM (and SGLang) list it in ``GET /v1/models``, whose ``root`` (else ``id``) is the directory or hub id
the server loaded. That one is used when the tokenizer is available here: a local directory, or a hub id already in
the local HuggingFace cache (a gateway never downloads a model on its own). When none is found, builders read the
end-of-turn token from the recorded completions instead (``polar_cli.builders.end_of_turn``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_cli.errors import PolarError
from polar_cli.interfaces.builder import TokenizerSource
from polar_cli.proxy import HttpChatClient, ProxyState, demo_tokenizer_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelTokenizer:
    """A tokenizer directory or hub id, and where it was found."""

    name_or_path: str
    source: TokenizerSource


class ModelTokenizerFinder:
    """Finds the tokenizer once per gateway (a failed server query is asked again next time)."""

    def __init__(self, proxy: ProxyState) -> None:
        self.proxy = proxy
        self._found: ModelTokenizer | None = None
        self._done = False
        self._lock = asyncio.Lock()

    async def find(self) -> ModelTokenizer | None:
        async with self._lock:
            if not self._done:
                self._found, self._done = await self._find()
            return self._found

    async def _find(self) -> tuple[ModelTokenizer | None, bool]:
        config = self.proxy.config
        if config.tokenizer:
            return ModelTokenizer(config.tokenizer, "proxy"), True
        if config.backend == "scripted":
            return ModelTokenizer(str(demo_tokenizer_dir()), "demo"), True
        backend = next((c for c in self.proxy.pool.clients() if isinstance(c, HttpChatClient)), None)
        if backend is None:
            return None, True
        try:
            listing = await backend.request("GET", "/v1/models")
        except PolarError as exc:
            log.warning("could not ask the inference server for its model: %s", exc)
            return None, False
        source = server_model_source(listing, config.model)
        return (ModelTokenizer(source, "server") if source and available(source) else None), True


def server_model_source(listing: Any, model: str | None) -> str | None:
    """The directory or hub id behind ``model`` (else the first model) in a ``/v1/models`` answer."""
    entries = [e for e in (listing.get("data") or []) if isinstance(e, dict)] if isinstance(listing, dict) else []
    chosen = next((e for e in entries if e.get("id") == model), entries[0] if entries else None)
    if chosen is None:
        return None
    source = chosen.get("root") or chosen.get("id")
    return source if isinstance(source, str) and source else None


def available(source: str) -> bool:
    """Whether the tokenizer ``source`` can be loaded here without a download."""
    if Path(source).expanduser().is_dir():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(
            isinstance(try_to_load_from_cache(source, name), str)
            for name in ("generation_config.json", "tokenizer_config.json")
        )
    except Exception:  # not a hub id, or no huggingface_hub: not available
        return False
