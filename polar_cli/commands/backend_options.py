"""The inference-backend options ``polar proxy``, ``run``, ``serve`` and ``generate`` share: each declared once here as
a typer ``Annotated`` alias (a command gives its own default), and :func:`proxy_overrides`, the ProxyConfig fields
they set."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from polar_cli.config import set_dotted
from polar_cli.models import validate_model
from polar_cli.proxy import ProxyConfig

Backend = Annotated[
    str | None, typer.Option("--backend", help="Inference backend: vllm, sglang, openai, scripted (or a plugin).")
]
BackendUrl = Annotated[
    list[str] | None,
    typer.Option(
        "--backend-url",
        help="Inference server URL (vllm/sglang/openai); repeat it for a pool of replicas (data-parallel servers).",
    ),
]
Model = Annotated[str | None, typer.Option("--model", help="Upstream model name (default: the server's first model).")]
Tokenizer = Annotated[
    str | None, typer.Option("--tokenizer", help="HF tokenizer dir or id (scripted default: demo tokenizer).")
]
Script = Annotated[
    str | None, typer.Option("--script", help="Scripted backend: JSON/YAML script file for every session.")
]
BackendTimeout = Annotated[
    float | None,
    typer.Option("--backend-timeout", help="Seconds one backend attempt may take (default 600).", show_default=False),
]
BackendCheckTimeout = Annotated[
    float | None,
    typer.Option(
        "--backend-check-timeout",
        help="Seconds the start-up check waits for a backend that took the connection but is busy (slow, or 503) "
        "(default 120); one that refuses or answers another error fails at once.",
        show_default=False,
    ),
]
BackendRetries = Annotated[
    int | None,
    typer.Option(
        "--backend-retries", min=0, help="Retries of a transient backend failure (default 3).", show_default=False
    ),
]
StreamMode = Annotated[
    str | None,
    typer.Option(
        "--stream-mode",
        help="Streaming requests: passthrough (re-encode the backend's stream as it comes; vllm only, others fall "
        "back to synthetic) or synthetic (wait for the whole answer, then replay it).",
    ),
]

TokenModeOption = Annotated[
    str | None,
    typer.Option(
        "--token-mode",
        help="How prompts are built for tasks that do not say (agent.token_mode): messages (the server renders "
        "them) or tokens (as ids, earlier answers spliced in exactly as sampled; vllm with --enable-scale-out, or "
        "scripted).",
        show_default=False,
    ),
]


def proxy_overrides(
    *,
    backend: str | None = None,
    backend_url: list[str] | None = None,
    model: str | None = None,
    tokenizer: str | None = None,
    script: str | None = None,
    backend_timeout: float | None = None,
    backend_retries: int | None = None,
    backend_check_timeout: float | None = None,
    stream_mode: str | None = None,
    token_mode: str | None = None,
) -> dict[str, Any]:
    """The ProxyConfig fields the backend options set, as dotted keys for ``config.set_dotted`` (None: not given)."""
    return {
        "backend": backend,
        "backend_url": (backend_url[0] if len(backend_url) == 1 else backend_url) if backend_url else None,
        "model": model,
        "tokenizer": tokenizer,
        "script": script,
        "backend_timeout_s": backend_timeout,
        "backend_check_timeout_s": backend_check_timeout,
        "retry.attempts": None if backend_retries is None else backend_retries + 1,
        "stream_mode": stream_mode,
        "token_mode": token_mode,
    }


def proxy_config(overrides: dict[str, Any], *, source: str, **fields: Any) -> ProxyConfig:
    """The ProxyConfig of ``fields`` with the backend options' ``overrides`` (:func:`proxy_overrides`) on top."""
    return validate_model(ProxyConfig, set_dotted(fields, overrides, source=source), source=source)
