"""The input options of the commands that read finished work (``polar export``, ``polar view``, ``polar verify``):
PATH, or ``--server URL`` with ``--task ID`` (repeatable) and/or ``--since WHEN`` (polar_cli/inputs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polar_cli.commands.submit import ServerOption, TokenOption
from polar_cli.inputs import Source, command_source

ONLINE_HELP = (
    "a polar serve data dir, a polar status TASK --json file; or, without PATH, --server URL --task ID (tasks on a "
    "running server)"
)
TaskOption = Annotated[
    list[str] | None,
    typer.Option("--task", metavar="ID", help="With --server: read this task (repeatable).", show_default=False),
]
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="WHEN",
        help="With --server: every task that ended since WHEN (epoch seconds, ISO 8601 time, or 30m / 2h / 1d ago).",
        show_default=False,
    ),
]

__all__ = ["ONLINE_HELP", "ServerOption", "SinceOption", "TaskOption", "TokenOption", "source"]


def source(path: Path | None, server: str | None, token: str | None, tasks: list[str] | None,
           since: str | None) -> Source:  # fmt: skip
    """What to read (ConfigError, a one-line exit 2, for options that do not go together)."""
    return command_source(path, server=server, token=token, tasks=tasks, since=since)
