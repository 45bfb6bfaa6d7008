"""The proxy's configuration (what ``polar proxy`` options and the gateway's config fill in)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from polar_cli.errors import ConfigError
from polar_cli.models import StrictModel, TokenMode
from polar_cli.models.chat import StreamMode
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.proxy.pool import PoolConfig
from polar_cli.proxy.retry import RetryConfig
from polar_cli.web.auth import new_token

_HTTP_BACKENDS = frozenset({"vllm", "sglang", "openai"})
NO_SCRIPT = "the scripted backend has no script to play (docs/scripted-backend.md): give {where}, or use a model: \
--backend vllm --backend-url URL"


class ProxyConfig(StrictModel):
    """Everything one proxy needs: the backend, where journals go, where it listens."""

    backend: str = "scripted"
    backend_url: str | list[str] | None = Field(
        default=None, description="inference server URL; several (a list) make a pool of replicas (docs/service.md)"
    )
    pool: PoolConfig = Field(default_factory=PoolConfig, description="how the pool of replicas is watched")
    model: str | None = Field(default=None, description="upstream model name (scripted: the name it reports)")
    tokenizer: str | None = Field(default=None, description="HF tokenizer dir or id")
    script: str | None = Field(default=None, description="scripted backend: default script file for every session")
    journal_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    public_url: str | None = Field(default=None, description="base URL handed to harnesses; default: where it listens")
    control_token: str = Field(
        default_factory=new_token, description="the Bearer token every control route needs; generated when not given"
    )
    retry: RetryConfig = Field(default_factory=RetryConfig)
    backend_timeout_s: float | None = Field(default=None, gt=0)
    backend_check_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="how long the start-up check waits for a backend that took the connection but is busy (slow, or "
        "503) before it gives up; one that refuses or answers another error fails at once",
    )
    backend_options: dict[str, Any] = Field(default_factory=dict, description="extra backend-specific options")
    max_body_mb: float = Field(default=64.0, gt=0)
    max_prompt_tokens: int | None = Field(
        default=None,
        gt=0,
        description="the most prompt tokens one request may make the proxy parse, tokenize or render (count_tokens, "
        "token mode, the scripted backend); default: the model's context length as the server reports it, else "
        "131072 (docs/proxy.md, Limits)",
    )
    token_mode: TokenMode = Field(
        default="messages",
        description="how prompts are built for sessions that do not say (agent.token_mode): messages (the server "
        "renders them) or tokens (as ids, earlier answers spliced in as sampled; vllm with --enable-scale-out, or "
        "scripted)",
    )
    stream_mode: StreamMode = Field(
        default="passthrough",
        description="streaming requests: re-encode the backend's stream as it comes (backends that stream token "
        "ids: vllm, scripted; others fall back to synthetic) or wait for the whole answer and replay it",
    )

    @field_validator("control_token", mode="before")
    @classmethod
    def _token(cls, value: Any) -> Any:
        return value or new_token()  # never open: a missing token is a generated one

    def check_scripted(
        self, task_id: str, metadata: Mapping[str, Any], where: str = "--script FILE or the task's metadata.script"
    ) -> None:
        """ConfigError when the scripted backend would play task ``task_id`` with no script at all (neither the
        proxy's ``script`` nor the task's ``metadata.script``): its sessions would get only the filler turn, not a
        model. ``where`` says where a script can come from in the caller's terms."""
        if self.backend == "scripted" and self.script is None and SCRIPT_KEY not in metadata:
            raise ConfigError(f"task {task_id!r}: {NO_SCRIPT.format(where=where)}")

    @field_validator("backend_url", mode="after")
    @classmethod
    def _urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            if not value:
                return None
            if len(set(value)) != len(value):
                raise ValueError("the same backend URL is given twice")
        return value

    def backend_urls(self) -> list[str | None]:
        """The pool's replicas: each URL given, or ``[None]`` for a backend without one (scripted)."""
        if self.backend_url is None:
            return [None]
        return [self.backend_url] if isinstance(self.backend_url, str) else list(self.backend_url)

    def backend_config(self, url: str | None = None, *, pooled: bool = False) -> dict[str, Any]:
        """Keyword options for ``InferenceBackend.client`` (built-in backends get only what they accept), for the
        replica at ``url`` (default: the first). ``pooled``: the pool retries and fails over itself, so each replica's
        client tries once."""
        from polar_cli.registry import get_backend  # at call time: the registry imports the proxy's plugins

        get_backend(self.backend)  # an unknown name fails here, before anything starts, with a did-you-mean
        options: dict[str, Any] = {}
        if self.backend == "scripted":
            if self.backend_url:
                raise ConfigError("the scripted backend takes no --backend-url")
            options.update(script=self.script, tokenizer=self.tokenizer, model=self.model)
        else:
            if self.script:
                raise ConfigError("--script only applies to the scripted backend")
            if self.backend in _HTTP_BACKENDS and not self.backend_url:
                raise ConfigError(f"the {self.backend} backend needs --backend-url")
            options.update(url=url or self.backend_urls()[0], model=self.model, tokenizer=self.tokenizer)
            if self.backend in _HTTP_BACKENDS:
                options["retry"] = self.retry.model_copy(update={"attempts": 1}) if pooled else self.retry
                options["timeout_s"] = self.backend_timeout_s
        options.update(self.backend_options)
        return {k: v for k, v in options.items() if v is not None}
