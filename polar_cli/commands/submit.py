"""``polar submit TASK.yaml --server URL [--task-id ID] [--wait] [--json]``: send a task to a rollout server
(``polar serve``).

Prints the task id on stdout; with ``--wait``, follows its sessions and prints the same summary table as ``polar run``.
With ``--json``, stdout holds one JSON document instead: the SubmitAnswer, or with ``--wait`` the final TaskStatus
(every SessionResult included); everything for people goes to stderr.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from polar_cli.client import SERVER_ENV, TOKEN_ENV, PolarClient
from polar_cli.commands.interrupt import Interrupted, stop_on_signals
from polar_cli.commands.output import JsonOption, emit_json, progress_bar, stderr_console, stdout_console
from polar_cli.commands.reward_tables import task_reward_table
from polar_cli.commands.run import any_failed, build_task, styled, summary_table
from polar_cli.errors import EXIT_FAILED, EXIT_OK
from polar_cli.models import SubmitAnswer, TaskStatus

ServerOption = Annotated[
    str | None, typer.Option("--server", help=f"The rollout server's URL (default: ${SERVER_ENV}).", show_default=False)
]
TokenOption = Annotated[
    str | None, typer.Option("--token", help=f"The server token (default: ${TOKEN_ENV}).", show_default=False)
]


def outcome(status: TaskStatus) -> str:
    """``running, 1 completed, 0 failed of 4``: how a task stands or ended."""
    return f"{styled(status.state)}, {status.completed} completed, {status.failed} failed of {status.num_samples}"


def _follow_again(task_file: Path, task_id: str, samples: int | None) -> str:
    """The command that follows the same task again (the same body under the same id is the same task)."""
    argv = ["polar", "submit", str(task_file), "--task-id", task_id]
    if samples is not None:
        argv += ["--samples", str(samples)]
    return shlex.join([*argv, "--wait"])


def submit(
    task_file: Annotated[Path, typer.Argument(help="A TaskRequest as YAML or JSON.", show_default=False)],
    server: ServerOption = None,
    token: TokenOption = None,
    samples: int | None = typer.Option(None, "--samples", min=1, help="num_samples: sessions to run."),
    task_id: str | None = typer.Option(
        None,
        "--task-id",
        help="Submit under this id (default: the file's task_id, else a fresh one each time). The same id and body "
        "again is the same task: nothing new runs.",
        show_default=False,
    ),
    wait: bool = typer.Option(False, "--wait", help="Follow the task until it ends and summarize its sessions."),
    as_json: bool = JsonOption,
) -> None:
    """Submit a task to a rollout server and print its id; with --wait, show progress and a summary table.

    With --wait, exits 1 when the task ended failed or cancelled or any session ended with status error or
    no_model_call, else 0 (docs/cli.md). SIGTERM or Ctrl-C stops following the
    task (it keeps running on the server)."""
    task = build_task(task_file, {"num_samples": samples, "task_id": task_id})
    console = stderr_console()
    answer: SubmitAnswer | None = None
    final: TaskStatus | None = None
    try:
        with stop_on_signals(), PolarClient(server, token) as client:
            answer = client.submit(task)
            _announce(client, answer, console)
            if not as_json:
                typer.echo(answer.task_id)
            elif not wait:
                emit_json(answer)
            if wait:
                final = _follow(client, answer.task_id, task.num_samples, console)
    except Interrupted as stop:
        again = _follow_again(task_file, task.task_id, samples)
        if answer is None:
            console.print(f"stopped before the server answered: `polar status {task.task_id}` tells whether task "
                          f"{task.task_id} reached it; `{again}` submits or follows it")  # fmt: skip
        else:
            console.print(f"stopped following task {task.task_id}: it keeps running on the server; `polar status "
                          f"{task.task_id}` shows it, `{again}` follows it again")  # fmt: skip
        raise typer.Exit(stop.exit_code) from None
    if final is None:
        return
    results = sorted(final.results, key=lambda r: (r.sample_index, r.session_id))
    out = console if as_json else stdout_console()
    out.print(summary_table(results))
    if (rewards := task_reward_table(final)) is not None:
        out.print(rewards)
    console.print(f"task {final.task_id}: {outcome(final)}")
    if as_json:
        emit_json(final)
    ended_badly = final.state in ("failed", "cancelled") or any_failed(results)
    raise typer.Exit(EXIT_FAILED if ended_badly else EXIT_OK)


def _announce(client: PolarClient, answer: SubmitAnswer, console: Console) -> None:
    """Say what the submission did: a new task, or one that existed with this body (and how it stands or ended)."""
    if answer.created:
        console.print(f"submitted [bold]{answer.task_id}[/bold] ({answer.status}) to {client.url}")
    else:
        existing = client.status(answer.task_id)
        console.print(f"task [bold]{answer.task_id}[/bold] already existed on {client.url} with this body: "
                      f"{outcome(existing)}; nothing new runs (--task-id NEW runs it again)")  # fmt: skip


def _follow(client: PolarClient, task_id: str, samples: int, console: Console) -> TaskStatus:
    """A progress bar over the task's sessions as they finish; the final TaskStatus."""
    with progress_bar(console, "last") as progress:
        bar = progress.add_task(task_id, total=samples, last="waiting")
        for result in client.results(task_id):
            progress.update(bar, advance=1, last=f"{result.session_id}: {styled(result.status)}")
    return client.status(task_id)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
