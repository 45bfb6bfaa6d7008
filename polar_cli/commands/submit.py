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
from polar_cli.commands.run import build_task, styled, summary_table

ServerOption = Annotated[
    str | None, typer.Option("--server", help=f"The rollout server's URL (default: ${SERVER_ENV}).", show_default=False)
]
TokenOption = Annotated[
    str | None, typer.Option("--token", help=f"The server's token (default: ${TOKEN_ENV}).", show_default=False)
]


def submit(
    task_file: Annotated[Path, typer.Argument(help="A TaskRequest as YAML or JSON.", show_default=False)],
    server: ServerOption = None,
    token: TokenOption = None,
    samples: int | None = typer.Option(None, "--samples", help="num_samples: sessions to run."),
    wait: bool = typer.Option(False, "--wait", help="Follow the task until it ends and summarize its sessions."),
) -> None:
    """Submit a task to a rollout server and print its id; with --wait, show progress and a summary table.

    With --wait, exits 1 when any session ended with status error, else 0."""
    task = build_task(task_file, {"num_samples": samples})
    console = Console(stderr=True)
    with PolarClient(server, token) as client:
        answer = client.submit(task)
        console.print(f"submitted [bold]{answer.task_id}[/bold] ({answer.status}) to {client.url}")
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
    console.print(f"task {final.task_id}: {styled(final.state)}, {final.completed} completed, {final.failed} failed "
                  f"of {final.num_samples}")  # fmt: skip
    raise typer.Exit(1 if any(r.status == "error" for r in results) else 0)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
