"""``polar serve``: the rollout service. No flags: server and one gateway in one process; ``--role server`` /
``--role gateway --server URL --server-token T`` for many machines; ``--config serve.yaml`` for the same as a file."""

from __future__ import annotations

import contextlib
import functools
import logging
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from polar_cli.client import SERVER_ENV, TOKEN_ENV
from polar_cli.commands import backend_options
from polar_cli.commands.interrupt import Interrupted, run_until_stopped
from polar_cli.commands.retention_options import (
    RetentionMaxAge,
    RetentionMaxBytes,
    RetentionModeOption,
    retention_flags,
)
from polar_cli.config import read_data_file, set_dotted
from polar_cli.errors import ConfigError
from polar_cli.gateway import agent, backend_check, sweeps
from polar_cli.gateway.agent import Drained
from polar_cli.launch import INFO_FILE, ServeConfig, ServeInfo, serve
from polar_cli.models import validate_model


def build_config(path: Path | None, role: str | None, flags: dict[str, Any]) -> ServeConfig:
    """The topology file (if any) with the command-line ``flags`` (dotted keys; None = not given) on top."""
    data: Any = read_data_file(path) if path is not None else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a serve config holds one mapping, not {type(data).__name__}")
    source = str(path) if path is not None else "polar serve"
    if role is not None:
        data["role"] = role
    base = validate_model(ServeConfig, data, source=source)  # names the bad field and the file before flags apply
    overrides: dict[str, Any] = {}
    for dotted, value in flags.items():
        if value is None:  # not given (and never str(None): a data dir named "None")
            continue
        if dotted == "token":
            overrides["gateway.control_token" if base.role == "gateway" else "server.token"] = value
        elif dotted in ("host", "port", "data_dir", "public_url"):
            targets = {"server": ["server"], "gateway": ["gateway"], "all": ["server", "gateway"]}[base.role]
            if dotted == "port" and base.role == "all":
                targets = ["server"]  # the embedded gateway keeps its own (default: any free port)
            if dotted == "public_url" and base.role == "all":
                targets = ["gateway"]
            for target in targets:
                overrides[f"{target}.{dotted}"] = str(value) if dotted == "data_dir" else value
        elif dotted == "connect_file":
            overrides[dotted] = str(value)
        else:
            overrides[dotted] = value
    return validate_model(ServeConfig, set_dotted(data, overrides, source=source), source=source)


def _announce(info: ServeInfo, data_dir: Path, connect: Path | None = None) -> None:
    if info.url and connect is not None:  # a job's log may be readable by others: the token stays in the file
        typer.echo(f"Polar rollout server on {info.url}  (role: {info.role}; data: {data_dir})")
        typer.echo(f"  its URL for other hosts and its token are in {connect} (mode 0600)")
    elif info.url:
        typer.echo(f"Polar rollout server on {info.url}  (role: {info.role}; data: {data_dir})")
        typer.echo(f"  server token: {info.token}")
        exports = f"{SERVER_ENV}={shlex.quote(info.url)} {TOKEN_ENV}={shlex.quote(info.token or '')}"
        typer.echo(f"  export {exports}    # in the shell that submits, then:")
        typer.echo("  polar submit TASK.yaml --wait    # TASK.yaml: a task file, e.g. examples/shell-agent.yaml")
    if info.gateway_url:
        typer.echo(f"Gateway node {info.node_id} on {info.gateway_url}")
    if info.metrics_url:
        typer.echo(f"Prometheus metrics (no token) on {info.metrics_url}")
    # one machine-readable line (also in <data_dir>/serve.json)
    fields = {
        "role": info.role,
        "url": info.url,
        "token": info.token if connect is None else None,
        "gateway_url": info.gateway_url,
        "node_id": info.node_id,
        "metrics_url": info.metrics_url,
    }
    typer.echo("POLAR_SERVE " + " ".join(f"{k}={v}" for k, v in fields.items() if v))
    typer.echo(f"({data_dir / INFO_FILE} has the same.)  Ctrl-C stops.")


def serve_command(
    role: Annotated[str | None, typer.Option("--role", help="all (default), server or gateway.")] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="A serve topology YAML/JSON.")] = None,
    host: str | None = typer.Option(None, "--host", help="Interface to listen on (default 127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="Port (server default 8780; gateway: any free one)."),
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="The server's database, a gateway's results and journals, serve.json (default: polar-data in the "
            "current directory, or what --config says). Start again with the same one to resume.",
            show_default=False,
        ),
    ] = None,
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="POLAR_TOKEN",
        help="This process's token (server token; with --role gateway the node token).",
    ),
    server: str | None = typer.Option(None, "--server", help="--role gateway: the rollout server's URL."),
    server_token: str | None = typer.Option(
        None, "--server-token", envvar="POLAR_SERVER_TOKEN", help="--role gateway: the server token (to register)."
    ),
    public_url: str | None = typer.Option(
        None,
        "--public-url",
        help="Role gateway: its URL as the server reaches it; role server: its URL as other hosts reach it (in the "
        "connect file). Without a port, the bound one.",
    ),
    connect_file: Annotated[
        Path | None,
        typer.Option(
            "--connect-file",
            help="Role server: write its URL and token to this file (mode 0600) once it listens; role gateway: wait "
            "for it and register with what it says. In a folder both hosts see: no token on a command line.",
        ),
    ] = None,
    node_id: str | None = typer.Option(None, "--node-id", help="The gateway's node id (default: kept in data dir)."),
    backend: backend_options.Backend = None,
    backend_url: backend_options.BackendUrl = None,
    model: backend_options.Model = None,
    tokenizer: backend_options.Tokenizer = None,
    script: backend_options.Script = None,
    backend_timeout: backend_options.BackendTimeout = None,
    backend_retries: backend_options.BackendRetries = None,
    backend_check_timeout: backend_options.BackendCheckTimeout = None,
    stream_mode: backend_options.StreamMode = None,
    token_mode: backend_options.TokenModeOption = None,
    run_slots: int | None = typer.Option(None, "--run-slots", min=1, help="Harnesses running at once on the gateway."),
    heartbeat: float | None = typer.Option(None, "--heartbeat-interval", help="Seconds between gateway heartbeats."),
    drain_timeout: float | None = typer.Option(
        None,
        "--drain-timeout",
        help="On SIGTERM/Ctrl-C, take no new sessions and wait up to this many seconds for running ones "
        "(default 0: cancel them at once; the server runs them again). A second signal stops at once.",
    ),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        help="Also serve GET /metrics (Prometheus) on this port without a token, for a scraper (0: any free port). "
        "Without it, /metrics is served behind each part's token.",
    ),
    metrics_host: str | None = typer.Option(
        None, "--metrics-host", help="Interface of the --metrics-port listener (default 127.0.0.1)."
    ),
    retention_max_age: RetentionMaxAge = None,
    retention_max_bytes: RetentionMaxBytes = None,
    retention_mode: RetentionModeOption = None,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log warnings."),
) -> None:
    """Run the rollout service: server, gateway, or both (default). Prints the URL and the token to use."""
    logging.basicConfig(
        level=logging.WARNING if verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s"
    )
    # a wait for a busy backend or for the server to answer, and what a runtime sweep removed, are always said
    for said in (backend_check, agent, sweeps):
        logging.getLogger(said.__name__).setLevel(logging.WARNING)
    proxy_overrides = backend_options.proxy_overrides(
        backend=backend, backend_url=backend_url, model=model, tokenizer=tokenizer, script=script,
        backend_timeout=backend_timeout, backend_retries=backend_retries, stream_mode=stream_mode,
        token_mode=token_mode, backend_check_timeout=backend_check_timeout,
    )  # fmt: skip
    flags = {
        "host": host,
        "port": port,
        "data_dir": data_dir,
        "token": token,
        "agent.server_url": server,
        "agent.server_token": server_token,
        "agent.node_id": node_id,
        "public_url": public_url,
        "connect_file": connect_file,
        **{f"gateway.proxy.{key}": value for key, value in proxy_overrides.items()},
        "gateway.pipeline.run_slots": run_slots,
        "server.heartbeat_interval_s": heartbeat,
        "drain_timeout_s": drain_timeout,
        "metrics.port": metrics_port,
        "metrics.host": metrics_host,
        **{f"server.retention.{key}": value
           for key, value in retention_flags(retention_max_age, retention_max_bytes, retention_mode).items()},
    }
    config = build_config(config_file, role, flags)
    config.gateway.proxy.backend_config()  # a bad backend combination fails now, not at the first session
    where = config.gateway.data_dir if config.role == "gateway" else config.server.data_dir
    for note in config.server.notes() if config.role != "gateway" else []:
        typer.echo(f"Note: {note}", err=True)

    with contextlib.suppress(Interrupted):  # the first signal drains (--drain-timeout), a second stops at once
        announce = functools.partial(
            _announce, data_dir=where, connect=config.connect_file if config.role != "gateway" else None
        )
        run_until_stopped(serve(config, announce, on_drain=_draining, on_drained=_drained))
    typer.echo(stopped_note(config, where), err=True)


def _draining(sessions: int, timeout: float) -> None:
    typer.echo(f"Draining: no new sessions; waiting up to {timeout:g} s for the {sessions} under way "
               "(signal again to stop now).", err=True)  # fmt: skip


def _drained(drained: Drained) -> None:
    """What the drain did, for the job's log: which sessions finished here and which went back to the server."""
    typer.echo(f"Drained: {len(drained.finished)} sessions finished here; {len(drained.handed_back)} handed back to "
               "the server (cancelled here, to run again elsewhere)"
               + (": " + " ".join(drained.handed_back) if drained.handed_back else "."), err=True)  # fmt: skip
    if drained.unreported:
        typer.echo(f"  {len(drained.unreported)} results not acknowledged by the server yet (kept, reported at the "
                   "next start): " + " ".join(drained.unreported), err=True)  # fmt: skip


def stopped_note(config: ServeConfig, where: Path) -> str:
    """The one line a stopped ``polar serve`` leaves: what it kept, and how to go on from there."""
    if config.role == "gateway":
        return (f"Stopped. Results the server has not acknowledged, and the journals, are kept in {where}; starting "
                f"again with --data-dir {where} reports them and rejoins as the same node.")  # fmt: skip
    return (f"Stopped. Tasks, sessions and results are kept in {where}; starting again with --data-dir {where} "
            "resumes them (sessions that were cut off run again).")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
