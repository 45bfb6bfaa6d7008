"""``polar status [TASK_ID] --server URL [--json]``: a rollout server's tasks, nodes and pending sessions, or one
task's sessions."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Group
from rich.table import Table

from polar_cli.client import PolarClient
from polar_cli.commands.output import JsonOption, emit_json, stdout_console
from polar_cli.commands.run import add_result_columns, result_cells, styled
from polar_cli.commands.submit import ServerOption, TokenOption
from polar_cli.models import ServiceStatus, TaskStatus


def _ago(timestamp: float | None) -> str:
    return "-" if timestamp is None else f"{max(0.0, time.time() - timestamp):.1f}s ago"


def service_tables(status: ServiceStatus) -> Group:
    """Tasks by state, one row per node (health, draining, load, last heartbeat), and the pending sessions."""
    tasks = Table(title="tasks")
    tasks.add_column("state")
    tasks.add_column("tasks", justify="right")
    for state, count in sorted(status.tasks.items()):
        tasks.add_row(styled(state), str(count))
    nodes = Table(title="nodes")
    counts = ("run slots", "running", "queued", "assigned")
    for column in ("node", "url", "health", "draining", *counts, "heartbeat"):
        nodes.add_column(column, justify="right" if column in counts else "left")
    for node in status.nodes:
        nodes.add_row(
            node.node_id,
            node.url,
            "[green]healthy[/green]" if node.healthy else "[red]unhealthy[/red]",
            "[yellow]draining[/yellow]" if node.draining else "no",
            str(node.load.run_slots),
            str(node.load.running),
            str(node.load.queued),
            "-" if node.load.assigned is None else str(node.load.assigned),
            _ago(node.last_heartbeat),
        )
    pending = f"pending sessions: {status.pending_sessions}"
    if status.pending_callbacks is not None:
        pending += f"   trainer callbacks not yet delivered: {status.pending_callbacks}"
    return Group(tasks, nodes, pending)


def task_table(status: TaskStatus) -> Table:
    """One row per session: its state, and its result's columns once it has finished."""
    finished = {r.session_id: r for r in status.results}
    table = Table(
        title=f"task {status.task_id}: {styled(status.state)}, {status.completed} completed, {status.failed} failed "
        f"of {status.num_samples}"
    )
    table.add_column("session")
    table.add_column("state")
    add_result_columns(table)
    for session_id, state in sorted(status.sessions.items()):
        result = finished.get(session_id)
        cells = result_cells(result) if result is not None else ["-"] * len(table.columns[2:])
        table.add_row(session_id, state, *cells)
    return table


def status(
    task_id: Annotated[str | None, typer.Argument(help="Show this task's sessions.", show_default=False)] = None,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
) -> None:
    """Show a rollout server's tasks by state, its nodes (load, health, draining) and pending sessions; or, with a
    TASK_ID, that task's sessions."""
    with PolarClient(server, token) as client:
        answer: TaskStatus | ServiceStatus = client.status(task_id) if task_id else client.service_status()
    if as_json:
        emit_json(answer)
    elif isinstance(answer, TaskStatus):
        stdout_console().print(task_table(answer))
    else:
        stdout_console().print(service_tables(answer))


def register(app: typer.Typer) -> None:
    app.command("status")(status)
