"""``polar proxy``: run the gateway proxy standalone and journal every model call a harness makes through it."""

from __future__ import annotations

import logging

import typer

from polar_cli.commands import backend_options
from polar_cli.commands.interrupt import Interrupted, run_until_stopped
from polar_cli.proxy import ProxyState, serve_proxy
from polar_cli.web.auth import CONTROL_TOKEN_ENV, resolve_token


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
    backend: backend_options.Backend = "scripted",
    backend_url: backend_options.BackendUrl = None,
    script: backend_options.Script = None,
    tokenizer: backend_options.Tokenizer = None,
    model: backend_options.Model = None,
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8787, help="Port to listen on (0: any free port)."),
    journal: str | None = typer.Option(None, "--journal", help="Directory for per-session JSONL journals."),
    public_url: str | None = typer.Option(None, "--public-url", help="Base URL handed to harnesses."),
    control_token: str | None = typer.Option(
        None,
        "--control-token",
        help=f"Bearer token the /sessions routes require (default: ${CONTROL_TOKEN_ENV}, else a generated one).",
    ),
    backend_timeout: backend_options.BackendTimeout = None,
    backend_retries: backend_options.BackendRetries = None,
    stream_mode: backend_options.StreamMode = "passthrough",
    token_mode: backend_options.TokenModeOption = None,
    max_prompt_tokens: int | None = typer.Option(
        None,
        "--max-prompt-tokens",
        min=1,
        help="The most prompt tokens one request may make the proxy tokenize or render (default: the model's context "
        "length, else 131072).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each backend error and warning."),
) -> None:
    """Run the gateway proxy: harnesses talk to it as their provider; every generation is journaled token-exactly."""
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    token, generated = resolve_token(control_token, CONTROL_TOKEN_ENV)
    overrides = backend_options.proxy_overrides(
        backend=backend, backend_url=backend_url, script=script, tokenizer=tokenizer, model=model,
        backend_timeout=backend_timeout, backend_retries=backend_retries, stream_mode=stream_mode,
        token_mode=token_mode,
    )  # fmt: skip
    config = backend_options.proxy_config(
        overrides, source="polar proxy", host=host, port=port, journal_dir=journal, public_url=public_url,
        control_token=token, max_prompt_tokens=max_prompt_tokens,
    )  # fmt: skip
    try:
        run_until_stopped(serve_proxy(config, lambda state: _ready(state, generated)))
    except Interrupted:  # Ctrl-C or SIGTERM: the app was cleaned up (sessions closed, journals flushed)
        typer.echo("Stopped.")


def register(app: typer.Typer) -> None:
    app.command("proxy")(proxy)
