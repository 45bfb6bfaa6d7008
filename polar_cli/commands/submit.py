"""``polar submit TASK.yaml --server URL [--wait]``: send a task to a rollout server (``polar serve``).

Prints the task id on stdout; with ``--wait``, follows its sessions and prints the same summary table as ``polar run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from polar_cli.client import SERVER_ENV, TOKEN_ENV, PolarClient
from polar_cli.commands.output import stderr_console
from polar_cli.commands.run import build_task, styled, summary_table
from polar_cli.models import TaskStatus

ServerOption = Annotated[
    str | None, typer.Option("--server", help=f"The rollout server's URL (default: ${SERVER_ENV}).", show_default=False)
]
TokenOption = Annotated[
    str | None, typer.Option("--token", help=f"The server's token (default: ${TOKEN_ENV}).", show_default=False)
]


def outcome(status: TaskStatus) -> str:
    """``running, 1 completed, 0 failed of 4``: how a task stands or ended."""
    return f"{styled(status.state)}, {status.completed} completed, {status.failed} failed of {status.num_samples}"


def submit(
    task_file: Annotated[Path, typer.Argument(help="A TaskRequest as YAML or JSON.", show_default=False)],
    server: ServerOption = None,
    token: TokenOption = None,
    samples: int | None = typer.Option(None, "--samples", help="num_samples: sessions to run."),
    task_id: str | None = typer.Option(
        None,
        "--task-id",
        help="Submit under this id (default: the file's task_id, else a fresh one each time). The same id and body "
        "again is the same task: nothing new runs.",
        show_default=False,
    ),
    wait: bool = typer.Option(False, "--wait", help="Follow the task until it ends and summarize its sessions."),
) -> None:
    """Submit a task to a rollout server and print its id; with --wait, show progress and a summary table.

    With --wait, exits 1 when any session ended with status error, else 0."""
    task = build_task(task_file, {"num_samples": samples, "task_id": task_id})
    console = stderr_console()
    with PolarClient(server, token) as client:
        answer = client.submit(task)
        if answer.created:
            console.print(f"submitted [bold]{answer.task_id}[/bold] ({answer.status}) to {client.url}")
        else:
            existing = client.status(answer.task_id)
            console.print(f"task [bold]{answer.task_id}[/bold] already existed on {client.url} with this body: "
                          f"{outcome(existing)}; nothing new runs (--task-id NEW runs it again)")  # fmt: skip
        typer.echo(answer.task_id)
        if not wait:
            return
        with Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"), console=console,
        ) as progress:  # fmt: skip
            bar = progress.add_task(task.task_id, total=task.num_samples, last="waiting")
            for result in client.results(answer.task_id):
                progress.update(bar, advance=1, last=f"{result.session_id}: {styled(result.status)}")
        final = client.status(answer.task_id)
    results = sorted(final.results, key=lambda r: (r.sample_index, r.session_id))
    Console().print(summary_table(results))
    console.print(f"task {final.task_id}: {outcome(final)}")
    raise typer.Exit(1 if any(r.status == "error" for r in results) else 0)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
