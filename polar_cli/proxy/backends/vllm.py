"""The vLLM backend: exact prompt and sampled token ids plus logprobs from vLLM's chat endpoint (vLLM >= 0.10.2).

Weight updates use the routes a vLLM server has only with ``VLLM_SERVER_DEV_MODE=1`` (checked on vLLM 0.32,
.ci/VLLM_NOTES.md "Weight updates"): ``POST /pause?mode=keep`` and ``/resume``, ``POST /collective_rpc`` running the
worker's ``reload_weights`` and ``POST /reset_prefix_cache``, and ``GET /server_info`` for ``--logprobs-mode``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from polar_cli.errors import BackendError
from polar_cli.models.chat import ChatRequest, Generation, JsonTokenIds, Rendered, UpstreamStream
from polar_cli.models.inference import LogprobsMode
from polar_cli.proxy.backends import vllm_tokens
from polar_cli.proxy.backends.http import HttpBackendConfig, HttpChatClient, base_generation, upstream_error
from polar_cli.proxy.retry import with_retries
from polar_cli.proxy.streaming import UpstreamStreamError, sse_chunks
from polar_cli.proxy.token_json import loads_keeping_prompt_ids

log = logging.getLogger(__name__)


def ties_output_layer(path: str) -> bool:
    """Whether the checkpoint at ``path`` (when this machine can read it) ties its output layer to the embedding:
    vLLM's in-place ``reload_weights`` keeps serving the ``lm_head`` it started with for such a model
    (.ci/VLLM_NOTES.md), so its recorded logprobs stop matching the loaded weights."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("tie_word_embeddings") is True

_SWITCHES = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
_LOGPROBS_MODES: dict[str, LogprobsMode] = {"raw_logprobs": "raw", "processed_logprobs": "processed"}


class VllmStream:
    """One open streaming response from vLLM, its first chunk already read."""

    def __init__(self, response: aiohttp.ClientResponse, chunks: AsyncIterator[dict[str, Any]], first: dict[str, Any]):
        self.response = response
        self._chunks = chunks
        self._first = first

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        try:
            yield self._first
            async for chunk in self._chunks:
                yield chunk
        finally:
            self.response.release()

    def abort(self) -> None:
        self.response.close()  # drops the connection: vLLM stops generating for a client that went away


class VllmClient(HttpChatClient):
    name = "vllm"
    streams_token_ids = True
    token_in = True
    reloads_weights = True

    def __init__(self, config: HttpBackendConfig) -> None:
        super().__init__(config)
        self.logprobs_mode = config.logprobs_mode or "raw"  # vLLM's default --logprobs-mode; preflight asks the server

    async def preflight(self, timeout_s: float) -> None:
        """The server answers and serves the model; without a configured ``logprobs_mode``, take the server's own."""
        await super().preflight(timeout_s)
        if self.config.logprobs_mode is None:
            self.logprobs_mode = await self.served_logprobs_mode(timeout_s)

    async def served_logprobs_mode(self, timeout_s: float) -> LogprobsMode:
        """The server's ``--logprobs-mode`` from ``GET /server_info`` (dev mode only); vLLM's default ``raw`` where the
        server does not say. BackendError when it returns logits, which are no logprobs a trainer can use."""
        try:
            info = await self._once("GET", "/server_info?config_format=json", None, budget_s=timeout_s)
            mode = info["vllm_config"]["model_config"]["logprobs_mode"]
        except (BackendError, KeyError, TypeError):
            return "raw"  # no dev mode (404), or a shape this version does not have
        if mode not in _LOGPROBS_MODES:
            raise BackendError(
                f"the vLLM server at {self.config.url} runs with --logprobs-mode {mode}: it returns logits, not "
                "logprobs; start it with --logprobs-mode processed_logprobs (or raw_logprobs)",
                status=409,
            )
        return _LOGPROBS_MODES[mode]

    async def render(self, request: ChatRequest, *, add_generation_prompt: bool = True) -> Rendered:
        return await vllm_tokens.render(self, request, add_generation_prompt)

    async def check_token_in(self, timeout_s: float) -> None:
        await vllm_tokens.check_routes(self, timeout_s)

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        if request.token_prompt is not None:
            return await vllm_tokens.generate(self, request)
        return await super().generate(request, session_id=session_id)

    async def pause_generation(self, timeout_s: float) -> bool:
        """``POST /pause?mode=keep``: requests in flight stay frozen on the server; False without dev mode (404)."""
        return await self.control_if_served("/pause?mode=keep", None, timeout_s, what="a keep-mode pause")

    async def resume_generation(self, timeout_s: float) -> None:
        """``POST /resume`` (nothing to resume on a server without dev mode)."""
        await self.control_if_served("/resume", None, timeout_s, what="resuming generation")

    async def reload_weights(self, path: str, timeout_s: float) -> None:
        """``reload_weights`` from ``path`` through ``POST /collective_rpc``, in place, then ``POST
        /reset_prefix_cache``: the reload leaves KV computed under the old weights in the prefix cache, which later
        calls would reuse (requests frozen by a keep-mode pause are recomputed under the new weights)."""
        deadline = time.monotonic() + timeout_s
        if ties_output_layer(path):
            log.warning(
                "%s: the checkpoint at %s ties lm_head to the embedding; vLLM's in-place reload keeps the lm_head it "
                "started with, so the served model is not the one you saved (polar verify --recompute will fail). "
                "Serve an untied copy from the start (tie_word_embeddings: false): see examples/grpo_tiny",
                self.config.url,
                path,
            )
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": path}, "timeout": timeout_s}
        try:
            await self.control("/collective_rpc", rpc, timeout_s, what=f"loading weights from {path}")
        except BackendError as exc:
            if exc.status == 404:
                raise BackendError(
                    f"the vLLM server at {self.config.url} cannot load weights from disk: it has no /collective_rpc "
                    "route; start it with VLLM_SERVER_DEV_MODE=1",
                    status=409,
                ) from exc
            raise BackendError(
                f"{exc}. vLLM may have dropped the old weights already: load a checkpoint that works before this "
                "server serves again (a model call now can kill its engine)",
                status=exc.status,
            ) from exc
        await self.control(
            "/reset_prefix_cache?reset_running_requests=true",
            None,
            max(deadline - time.monotonic(), 1.0),
            what=f"resetting the prefix cache after loading weights from {path}",
        )

    async def open_stream(self, request: ChatRequest, *, session_id: str) -> UpstreamStream:
        """POST a streaming chat request; transient failures before the first byte are retried like ``generate``."""
        if request.token_prompt is not None:
            raise BackendError("token mode streams are replayed whole (the proxy answers them synthetic)", status=500)
        model = await self.served_model()
        body = self.upstream_body(request, model)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": False}
        top = request.context.get("top_logprobs")
        if isinstance(top, int) and top > 0 and request.context.get("logprobs"):
            body["top_logprobs"] = min(top, 20)  # the client's alternatives ride along; the sampled logprob is the same
        data = orjson.dumps(body)
        url = self.base + "/v1/chat/completions"

        async def attempt(budget: float) -> UpstreamStream:
            # the budget bounds connecting and the headers; the body streams for as long as the session allows
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.config.connect_timeout_s, sock_read=self.config.timeout_s
            )
            try:
                async with asyncio.timeout(budget):
                    response = await self.session.post(url, data=data, timeout=timeout)
                    if response.status >= 400:
                        raw = await response.read()
                        response.release()
                        raise upstream_error(self.name, response.status, raw, response.headers.get("Retry-After"))
                    chunks = sse_chunks(response.content, load=loads_keeping_prompt_ids)
                    try:  # a stream cut before its first chunk is as transient as a reset: tried again
                        first = await anext(chunks)
                    except (StopAsyncIteration, UpstreamStreamError, aiohttp.ClientPayloadError) as exc:
                        response.close()
                        raise BackendError(
                            f"{self.name} backend at {self.base} ended its stream before the first chunk: {exc}",
                            retryable=True,
                        ) from exc
            except TimeoutError as exc:
                raise BackendError(f"{self.name} backend at {self.base} timed out", status=504, retryable=True) from exc
            except aiohttp.ClientConnectionError as exc:
                raise BackendError(
                    f"{self.name} backend at {self.base} unreachable: {type(exc).__name__}: {exc}", retryable=True
                ) from exc
            return VllmStream(response, chunks, first)

        return await with_retries(
            attempt, self.config.retry, timeout_s=self.config.timeout_s, what=f"{self.name} backend at {self.base}"
        )

    def load_answer(self, raw: bytes) -> Any:
        data = loads_keeping_prompt_ids(raw)
        ids = data.get("prompt_token_ids") if isinstance(data, dict) else None
        if not isinstance(ids, JsonTokenIds):
            return data
        usage = data.get("usage")
        reported = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        # vLLM's usage.prompt_tokens is len(prompt_token_ids); counting 32K commas costs ~0.1 ms, so count only
        # when the server did not report it
        if isinstance(reported, int):
            ids.length = reported
        return data

    def token_switches(self) -> dict[str, Any]:
        return _SWITCHES

    def parse(self, data: dict[str, Any], request: ChatRequest) -> Generation:
        choice = data["choices"][0]
        prompt_ids = data.get("prompt_token_ids")
        response_ids = choice.get("token_ids")
        if prompt_ids is None or response_ids is None:
            raise BackendError(
                f"the vLLM server at {self.config.url} returned no token ids (prompt_token_ids / "
                "choices[0].token_ids): return_token_ids needs vLLM >= 0.10.2, and a router in front of the server "
                "may strip them (point the backend URL at the vLLM server itself)"
            )
        logprobs: list[float] | None = None
        tokens: list[str] | None = None
        content = (choice.get("logprobs") or {}).get("content")
        if content is not None and len(content) == len(response_ids):
            logprobs = [float(entry["logprob"]) for entry in content]
            tokens = [str(entry.get("token", "")) for entry in content]
        return base_generation(
            data,
            choice,
            self.name,
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_logprobs=logprobs,
            response_tokens=tokens,
            token_source="backend",
        )
