"""``polar proxy``: run the gateway proxy standalone and journal every model call a harness makes through it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import typer

from polar_cli.http import CONTROL_TOKEN_ENV, resolve_token
from polar_cli.models import validate_model
from polar_cli.proxy import ProxyConfig, ProxyState


def _ready(state: ProxyState, generated: bool) -> None:
    url = state.base_url
    journal = state.config.journal_dir
    typer.echo(f"Polar proxy on {url}  (backend: {state.config.backend}; journal: {journal or 'in memory'})")
    if generated:
        typer.echo(f"Control token (generated; set --control-token or ${CONTROL_TOKEN_ENV} to choose one):")
        typer.echo(f"  {state.config.control_token}")
    else:
        typer.echo(f"Control token: the one from --control-token or ${CONTROL_TOKEN_ENV}.")
    typer.echo("Create a session, then point a harness at one of its base_urls with its api_key:")
    typer.echo(f"  curl -s -X POST {url}/sessions -H 'Authorization: Bearer <token>' -d '{{}}'")
    typer.echo(f"Recorded calls: GET {url}/sessions/<session_id>/completions.  Ctrl-C stops.")


def proxy(
    backend: str = typer.Option("scripted", help="Inference backend: vllm, sglang, openai, scripted (or a plugin)."),
    backend_url: str | None = typer.Option(None, "--backend-url", help="Inference server URL (vllm/sglang/openai)."),
    script: str | None = typer.Option(None, help="Scripted backend: JSON/YAML script file for every session."),
    tokenizer: str | None = typer.Option(None, help="HF tokenizer dir or id (scripted default: demo tokenizer)."),
    model: str | None = typer.Option(None, help="Upstream model name (default: the server's first model)."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8787, help="Port to listen on (0: any free port)."),
    journal: str | None = typer.Option(None, "--journal", help="Directory for per-session JSONL journals."),
    public_url: str | None = typer.Option(None, "--public-url", help="Base URL handed to harnesses."),
    control_token: str | None = typer.Option(
        None,
        "--control-token",
        help=f"Bearer token the /sessions routes require (default: ${CONTROL_TOKEN_ENV}, else a generated one).",
    ),
    backend_timeout: float | None = typer.Option(
        None, "--backend-timeout", help="Seconds one backend attempt may take (default 600).", show_default=False
    ),
    backend_retries: int | None = typer.Option(
        None, "--backend-retries", min=0, help="Retries of a transient backend failure (default 3).", show_default=False
    ),
    stream_mode: str = typer.Option(
        "passthrough",
        "--stream-mode",
        help="Streaming requests: passthrough (re-encode the backend's stream as it comes; vllm only, others fall "
        "back to synthetic) or synthetic (wait for the whole answer, then replay it).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each backend error and warning."),
) -> None:
    """Run the gateway proxy: harnesses talk to it as their provider; every generation is journaled token-exactly."""
    from polar_cli.proxy import serve_proxy

    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    token, generated = resolve_token(control_token, CONTROL_TOKEN_ENV)
    options: dict[str, Any] = dict(
        backend=backend,
        backend_url=backend_url,
        script=script,
        tokenizer=tokenizer,
        model=model,
        host=host,
        port=port,
        journal_dir=journal,
        public_url=public_url,
        control_token=token,
        backend_timeout_s=backend_timeout,
        stream_mode=stream_mode,
    )
    if backend_retries is not None:
        options["retry"] = {"attempts": backend_retries + 1}
    config = validate_model(ProxyConfig, options, source="polar proxy")
    try:
        asyncio.run(serve_proxy(config, lambda state: _ready(state, generated)))
    except KeyboardInterrupt:
        typer.echo("Stopped.")


def register(app: typer.Typer) -> None:
    app.command("proxy")(proxy)
