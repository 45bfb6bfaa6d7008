"""Shared machinery of the HTTP backends: one aiohttp session per client, retries, error mapping, message cleanup."""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from pydantic import Field

from polar_cli.errors import BackendBusy, BackendError
from polar_cli.interfaces.backend import BackendClient, no_token_in
from polar_cli.models import StrictModel
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.models.inference import LogprobsMode
from polar_cli.proxy.retry import RETRYABLE_STATUSES, RetryConfig, parse_retry_after, with_retries

if TYPE_CHECKING:
    from polar_cli.proxy.render import ChatRenderer

_JSON_HEADERS = {"Content-Type": "application/json"}
# upstream statuses the harness sees as they are after retries; any other 5xx is the proxy's 502 Bad Gateway
_PASSED_STATUSES = frozenset({502, 503, 504})
CONTEXT_PROBE_S = 10.0
"""How long the question for the model's context length (the proxy's prompt budget) may take."""


class HttpBackendConfig(StrictModel):
    """Options shared by the vllm, sglang and openai backends."""

    url: str = Field(description="server base URL, with or without a trailing /v1")
    model: str | None = Field(default=None, description="upstream model name; default: the server's first model")
    api_key: str | None = Field(default=None, description="sent upstream as Authorization: Bearer")
    tokenizer: str | None = Field(default=None, description="HF tokenizer for local counting/retokenizing")
    timeout_s: float = Field(default=600.0, gt=0, description="per attempt; retry.total_s bounds the whole call")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=512, ge=1)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every upstream request")
    logprobs_mode: LogprobsMode | None = Field(
        default=None,
        description="which distribution the server's logprobs come from (raw: the model's, before temperature/top-p; "
        "processed: the one sampled from), recorded per completion; default: vllm asks the server (dev mode) and "
        "else assumes its default raw, other backends leave it unknown",
    )


def api_base(url: str) -> str:
    """``http://h:p`` from ``http://h:p``, ``http://h:p/`` or ``http://h:p/v1``."""
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _error_message(raw: bytes) -> str:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or data)[:500]
        return str(data.get("message") or err)[:500]
    return str(data)[:500]


def upstream_error(name: str, status: int, raw: bytes, retry_after: str | None) -> BackendError:
    """The BackendError for an upstream HTTP error answer (retryable when transient, Retry-After kept)."""
    err = BackendError(
        f"{name} backend returned HTTP {status}: {_error_message(raw)}",
        status=status if status < 500 or status in _PASSED_STATUSES else 502,
        retryable=status in RETRYABLE_STATUSES,
    )
    err.retry_after = parse_retry_after(retry_after)  # type: ignore[attr-defined]
    return err


def assistant_message(raw: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI assistant message with only the fields Polar uses (vLLM's ``reasoning`` → reasoning_content)."""
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = raw.get("tool_calls")
    if calls:
        out = []
        for call in calls:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            if not isinstance(args, str):
                args = orjson.dumps(args if args is not None else {}).decode()
            out.append(
                {"id": call.get("id"), "type": "function", "function": {"name": fn.get("name"), "arguments": args}}
            )
        message["tool_calls"] = out
    return message


class HttpChatClient(BackendClient):
    """A client for an OpenAI-compatible ``/v1/chat/completions`` server; subclasses add token switches and parsing."""

    def __init__(self, config: HttpBackendConfig) -> None:
        self.config = config
        self.base = api_base(config.url)
        self._session: aiohttp.ClientSession | None = None
        self._model: str | None = config.model
        self._renderer: ChatRenderer | None = None
        """The local tokenizer's renderer (``tokenizer``), made on the first local count."""
        self.logprobs_mode = config.logprobs_mode
        self._headers = dict(_JSON_HEADERS)
        if config.api_key:
            self._headers["Authorization"] = f"Bearer {config.api_key}"

    @property
    def session(self) -> aiohttp.ClientSession:
        # created lazily: an aiohttp session must be made inside the running loop
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s, sock_connect=self.config.connect_timeout_s),
                headers=self._headers,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _once(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        load: Callable[[bytes], Any] = orjson.loads,
        budget_s: float | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> Any:
        """One upstream try within ``budget_s`` seconds (default: the per-attempt timeout), or ``timeout``."""
        url = self.base + path
        timeout = timeout or aiohttp.ClientTimeout(
            total=budget_s or self.config.timeout_s, sock_connect=self.config.connect_timeout_s
        )
        try:
            data = orjson.dumps(body) if body is not None else None
            async with self.session.request(method, url, data=data, timeout=timeout) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except TimeoutError as exc:
            raise BackendError(f"{self.name} backend at {self.base} timed out", status=504, retryable=True) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # refused, reset, disconnected, or the body was cut off mid-way: transient from the harness's view
            raise BackendError(
                f"{self.name} backend at {self.base} unreachable: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        if status >= 400:
            raise upstream_error(self.name, status, raw, retry_after)
        try:
            return load(raw)
        except (ValueError, TypeError, AttributeError) as exc:  # orjson.JSONDecodeError is a ValueError
            # a close-delimited body cut off mid-way reads as bad JSON: worth another try
            raise BackendError(f"{self.name} backend returned non-JSON: {raw[:200]!r}", retryable=True) from exc

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, load: Callable[[bytes], Any] = orjson.loads
    ) -> Any:
        """One upstream call, retried on transient failures within the call's deadline; raises BackendError."""
        return await with_retries(
            lambda budget: self._once(method, path, body, load, budget),
            self.config.retry,
            timeout_s=self.config.timeout_s,
            what=f"{self.name} backend at {self.base}",
        )

    async def control(self, path: str, body: dict[str, Any] | None, timeout_s: float, *, what: str) -> Any:
        """One POST to a control route of the server (pause, resume, weights) within ``timeout_s``, never retried (a
        pause or a weight load is not blindly repeated): the parsed JSON answer, None for an empty or non-JSON body.

        BackendError naming ``what`` and the server's URL; its status is the server's own for a 4xx (404: the server
        has no such route, which callers explain), 504 on the timeout, else 502."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                data = orjson.dumps(body) if body is not None else None
                # a connection of its own: vLLM drops a kept-alive connection after a 500, so a pooled one may be
                # dead, and this call is not retried
                headers = {"Connection": "close"}
                async with self.session.post(self.base + path, data=data, headers=headers, timeout=timeout) as resp:
                    raw = await resp.read()
                    status = resp.status
        except TimeoutError as exc:
            raise BackendError(
                f"{what} on the {self.name} server at {self.config.url} did not finish within {timeout_s:g} s",
                status=504,
            ) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise BackendError(
                f"{what}: the {self.name} server at {self.config.url} is unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        if status >= 400:
            raise BackendError(
                f"{what} on the {self.name} server at {self.config.url} failed: HTTP {status}: {_error_message(raw)}",
                status=status if status < 500 else 502,
            )
        try:
            return orjson.loads(raw) if raw.strip() else None
        except orjson.JSONDecodeError:
            return None

    async def control_if_served(self, path: str, body: dict[str, Any] | None, timeout_s: float, *, what: str) -> bool:
        """``control`` for a route the server may lack (an older version, a mode that is off): False on its 404."""
        try:
            await self.control(path, body, timeout_s, what=what)
        except BackendError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def load_answer(self, raw: bytes) -> Any:
        """Parse a chat answer (backends may skip parsing bulky parts, see vllm)."""
        return orjson.loads(raw)

    async def models(self) -> list[str]:
        data = await self.request("GET", "/v1/models")
        return [str(m.get("id")) for m in (data.get("data") or []) if isinstance(m, dict)]

    async def preflight(self, timeout_s: float) -> None:
        """One ``GET /v1/models`` (no retries): the server is up, answers, and serves the configured model.

        BackendBusy when the server took the connection but gave no answer within ``timeout_s``, or answered 503
        (busy or loading); BackendError for anything else (refused, DNS, unreachable, another HTTP error)."""
        # the connect phase has its own bound, so a timeout after it means the server took the connection: busy
        connect_s = self.config.connect_timeout_s
        timeout = aiohttp.ClientTimeout(total=connect_s + timeout_s, sock_connect=connect_s, sock_read=timeout_s)
        try:
            data = await self._once("GET", "/v1/models", None, timeout=timeout)
        except BackendError as exc:
            root = exc.__cause__
            cause = f"{type(root).__name__}: {root}" if root is not None and str(root) else str(exc)
            message = f"the {self.name} backend at {self.config.url} does not answer: {cause}"
            connected = not isinstance(root, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))
            if exc.status == 503 or (connected and isinstance(root, TimeoutError)):
                raise BackendBusy(message) from exc
            raise BackendError(message) from exc
        names = [str(m.get("id")) for m in (data.get("data") or []) if isinstance(m, dict)] if isinstance(
            data, dict) else []  # fmt: skip
        if self._model is not None and names and self._model not in names:
            raise BackendError(
                f"{self.name} backend at {self.config.url} does not serve model {self._model!r} (it serves: "
                f"{', '.join(names)})"
            )

    async def served_model(self) -> str:
        """The configured model, or the server's first model (asked once)."""
        if self._model is None:
            names = await self.models()
            if not names:
                raise BackendError(f"{self.name} backend at {self.base} serves no model")
            self._model = names[0]
        return self._model

    def upstream_body(self, request: ChatRequest, model: str) -> dict[str, Any]:
        body = request.openai_body()
        body["model"] = model
        if self.config.extra_body:
            body.update(self.config.extra_body)
        body.update(self.token_switches())
        return body

    def token_switches(self) -> dict[str, Any]:
        """Request fields that make the server return token ids and logprobs."""
        return {}

    @abstractmethod
    def parse(self, data: dict[str, Any], request: ChatRequest) -> Generation:
        """Turn the server's JSON answer into a Generation (BackendError when token data is missing)."""

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        if request.token_prompt is not None:
            raise BackendError(no_token_in(self.name), status=409)
        model = await self.served_model()
        started = time.perf_counter()
        data = await self.request("POST", "/v1/chat/completions", self.upstream_body(request, model), self.load_answer)
        seconds = time.perf_counter() - started
        if not isinstance(data, dict) or not data.get("choices"):
            raise BackendError(f"{self.name} backend answered without choices")
        try:
            generation = self.parse(data, request)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BackendError(f"{self.name} backend answered a malformed body: {type(exc).__name__}: {exc}") from exc
        generation.backend_seconds = seconds
        return generation

    async def context_tokens(self) -> int | None:
        """The served model's (else the first model's) ``max_model_len`` as ``GET /v1/models`` lists it (vLLM,
        SGLang), else None. One try of at most CONTEXT_PROBE_S: a request waiting on it is not under its deadline."""
        data = await self._once("GET", "/v1/models", None, budget_s=CONTEXT_PROBE_S)
        entries = [e for e in (data.get("data") or []) if isinstance(e, dict)] if isinstance(data, dict) else []
        chosen = next((e for e in entries if e.get("id") == self._model), entries[0] if entries else None)
        length = chosen.get("max_model_len") if chosen is not None else None
        return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None

    async def count_tokens(self, request: ChatRequest) -> int:
        if self.config.tokenizer:
            from polar_cli.proxy.render import ChatRenderer, load_tokenizer

            if self._renderer is None:
                self._renderer = ChatRenderer(load_tokenizer(self.config.tokenizer))
            ids = await asyncio.to_thread(self._renderer.prompt_ids, request.messages, request.tools,
                                          request.prompt_budget)  # fmt: skip
            return len(ids)
        return await self.remote_count(request)

    async def remote_count(self, request: ChatRequest) -> int:
        """vLLM-style ``/tokenize`` with the chat template; a rough estimate where the server has none."""
        body: dict[str, Any] = {"model": await self.served_model(), "messages": request.messages}
        body["add_generation_prompt"] = True
        if request.tools:
            body["tools"] = request.tools
        try:
            data = await self._once("POST", "/tokenize", body)
            return int(data["count"])
        except (BackendError, KeyError, TypeError, ValueError):
            return max(1, len(orjson.dumps(request.messages)) // 4)


def base_generation(data: dict[str, Any], choice: dict[str, Any], backend: str, **fields: Any) -> Generation:
    """A Generation from the common parts of an OpenAI chat answer plus backend-specific token fields."""
    return Generation(
        id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
        message=assistant_message(choice.get("message") or {}),
        finish_reason=str(choice.get("finish_reason") or "stop"),
        backend=backend,
        created=int(data.get("created") or time.time()),
        **fields,
    )
