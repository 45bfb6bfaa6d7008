"""``polar inference status|add|remove|pause|resume|load-weights|cancel-stale``: the inference pools of a rollout
server's gateways, through the server (docs/service.md, "Weight updates").

Every command but ``cancel-stale`` prints the pools afterwards (one row per gateway and replica); ``--json`` prints
the ``InferenceStatus`` (``cancel-stale``: the ``CancelStaleAnswer``) instead.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from polar_cli.client import PolarClient
from polar_cli.commands.flags import positive_seconds
from polar_cli.commands.output import JsonOption, emit_json, stderr_console, stdout_console
from polar_cli.commands.submit import ServerOption, TokenOption
from polar_cli.models import InferenceStatus
from polar_cli.models.inference import PauseMode, ReplicaState
from polar_cli.node_protocol.messages import PAUSE_TIMEOUT_S

inference_app = typer.Typer(
    help="Pause, resume, reload weights and change the inference servers of every gateway, through the server.",
    no_args_is_help=True,
)

TimeoutOption = Annotated[
    float,
    typer.Option("--timeout", callback=positive_seconds, help="Seconds to wait for calls in flight to end."),
]
VersionOption = Annotated[
    int | None,
    typer.Option(
        "--policy-version",
        help="The policy version to sample under from now on (default: the current one + 1).",
        show_default=False,
    ),
]
_STATES: dict[ReplicaState, str] = {"healthy": "green", "unhealthy": "red", "draining": "yellow"}


def pools_table(status: InferenceStatus) -> Group:
    """The policy version and pause, then one row per gateway and replica: its role and the version of the weights it
    serves (a stale replica's lags), state, calls in flight and answered, errors, pinned sessions, the last error."""
    paused = f"[yellow]paused ({status.paused})[/yellow]" if status.paused else "[green]sampling[/green]"
    head = f"policy version {status.policy_version}, {paused}"
    table = Table(title="inference pools")
    counts = ("in flight", "waiting", "calls", "errors", "sessions")
    for column in ("gateway", "version", "replica", "role", "serves", "state", *counts, "last error"):
        table.add_column(column, justify="right" if column in counts else "left")
    for gateway in status.gateways:
        pool = gateway.pool
        if pool is None:
            table.add_row(gateway.node_id, "-", "-", "-", "-", "[red]no answer[/red]", *["-"] * len(counts),
                          escape(gateway.error or ""))  # fmt: skip
            continue
        version = f"{pool.policy_version}" + (f" (paused: {pool.paused})" if pool.paused else "")
        if not pool.replicas:
            table.add_row(gateway.node_id, version, "-", "-", "-", "-", str(pool.in_flight), str(pool.waiting),
                          "-", "-", "-", "")  # fmt: skip
        for i, replica in enumerate(pool.replicas):
            color = _STATES.get(replica.state, "white")
            table.add_row(
                gateway.node_id if i == 0 else "",
                version if i == 0 else "",
                escape(replica.url),
                replica.role if replica.role == "current" else f"[yellow]{replica.role}[/yellow]",
                "-" if replica.policy_version is None else str(replica.policy_version),
                f"[{color}]{replica.state}[/{color}]",
                str(replica.in_flight),
                str(pool.waiting) if i == 0 else "",
                str(replica.calls),
                str(replica.errors),
                str(replica.sessions),
                escape(replica.last_error or ""),
            )
    return Group(head, table)


def _show(status: InferenceStatus, as_json: bool) -> None:
    if as_json:
        emit_json(status)
    else:
        stdout_console().print(pools_table(status))


@inference_app.command("status")
def status_command(server: ServerOption = None, token: TokenOption = None, as_json: bool = JsonOption) -> None:
    """Show the policy version, whether sampling is paused, and every gateway's inference servers."""
    with PolarClient(server, token) as client:
        _show(client.inference(), as_json)


@inference_app.command("add")
def add_command(
    url: Annotated[str, typer.Argument(help="The inference server's base URL.", show_default=False)],
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Add an inference server to every gateway's pool."""
    with PolarClient(server, token) as client:
        _show(client.add_backend(url), as_json)


@inference_app.command("remove")
def remove_command(
    url: Annotated[str, typer.Argument(help="The inference server's base URL.", show_default=False)],
    timeout: TimeoutOption = PAUSE_TIMEOUT_S,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Take an inference server out of every pool that has it: no new calls go there, its calls in flight end."""
    with PolarClient(server, token) as client:
        _show(client.remove_backend(url, timeout=timeout), as_json)


@inference_app.command("pause")
def pause_command(
    mode: Annotated[
        PauseMode, typer.Option("--mode", help="wait: calls in flight finish first; keep: they are frozen.")
    ] = "wait",
    timeout: TimeoutOption = PAUSE_TIMEOUT_S,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Hold every new model call at the gateways; returns once the pools are quiet (wait) or frozen (keep)."""
    with PolarClient(server, token) as client:
        _show(client.pause(mode, timeout=timeout), as_json)


@inference_app.command("resume")
def resume_command(
    policy_version: VersionOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Let the held model calls go on, sampled under the new policy version."""
    with PolarClient(server, token) as client:
        _show(client.resume(policy_version), as_json)


@inference_app.command("load-weights")
def load_weights_command(
    path: Annotated[str, typer.Argument(help="The checkpoint, as the inference servers see it.", show_default=False)],
    policy_version: VersionOption = None,
    timeout: TimeoutOption = PAUSE_TIMEOUT_S,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Pause, have every inference server reload its weights from PATH, resume under the new policy version."""
    with PolarClient(server, token) as client:
        _show(client.load_weights(path, policy_version, timeout=timeout), as_json)


@inference_app.command("cancel-stale")
def cancel_stale_command(
    older_than: Annotated[
        int | None,
        typer.Option(
            "--older-than", help="The oldest policy version kept (default: the current one).", show_default=False
        ),
    ] = None,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Cancel (status stale) every running session whose oldest completion is older than that version."""
    with PolarClient(server, token) as client:
        answer = client.cancel_stale(older_than)
    if as_json:
        emit_json(answer)
        return
    stderr_console().print(f"cancelled {len(answer.cancelled)} stale session(s)")
    for session_id in answer.cancelled:
        typer.echo(session_id)


def register(app: typer.Typer) -> None:
    app.add_typer(inference_app, name="inference")
