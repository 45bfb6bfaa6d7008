"""What every command prints with: the stdout console (tables never cut to 80 columns in a pipe or a file), the
stderr console for human text and progress, and ``--json`` (one JSON document on stdout)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from polar_cli.errors import ConfigError

# Wide enough that no table cell is ever truncated when stdout is a pipe or a file (rich's default there is 80);
# tables are not expanded, so they take only the width they need.
PIPE_WIDTH = 100_000

JsonOption = typer.Option(False, "--json", help="Print one JSON document on stdout (human text goes to stderr).")
OverwriteOption = typer.Option(False, "--overwrite", help="Replace the output if it exists (default: refuse).")


def refuse_existing(path: Path, overwrite: bool, flag: str) -> None:
    """The one output convention (docs/cli.md): an output that exists is an error naming ``--overwrite``, unless
    given. Checked before any work starts, so a refusal costs nothing."""
    if not overwrite and path.exists():
        raise ConfigError(f"{flag} {path} exists: pass --overwrite to replace it")


def stdout_console() -> Console:
    """The console for tables and results on stdout: the terminal's width, or unlimited when not a terminal."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=PIPE_WIDTH)
    return console


def stderr_console() -> Console:
    """The console for progress and notes on stderr (what ``--json`` keeps off stdout)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=PIPE_WIDTH)
    return console


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def emit_json(document: Any) -> None:
    """Write ``document`` (pydantic models, lists and dicts of them, plain values) as one JSON document on stdout."""
    sys.stdout.write(orjson.dumps(_plain(document), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    sys.stdout.write("\n")
    sys.stdout.flush()


def progress_bar(console: Console, *fields: str, eta: bool = False) -> Progress:
    """The progress bar of every long command (on ``console``, the stderr one): the description, the bar, done of
    total, the time elapsed, then each task field in ``fields`` as text (and the time left with ``eta``)."""
    columns: list[ProgressColumn] = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn()]  # fmt: skip
    columns += [TextColumn(f"{{task.fields[{field}]}}") for field in fields]
    if eta:
        columns += [TextColumn("ETA"), TimeRemainingColumn()]
    return Progress(*columns, console=console)


class Steps:
    """Progress of a command that runs in steps: a live bar on stderr when stderr is a terminal, else one plain line
    per step (``polar export: writing 400 sessions (120/400)``, at most about one per tenth of a counted step)."""

    PLAIN_LINES_PER_STEP = 10

    def __init__(self, label: str, console: Console, progress: Progress | None) -> None:
        self.label = label
        self.console = console
        self.progress = progress
        self.task: TaskID | None = None
        self._text = ""
        self._shown = -1

    def step(self, text: str, done: int = 0, total: int | None = None) -> None:
        """Now doing ``text``; ``done`` of ``total`` items when it counts them."""
        if self.progress is not None:
            if self.task is None:
                self.task = self.progress.add_task(self.label, total=total, step=text)
            self.progress.update(self.task, completed=done, total=total, step=text)
            return
        tenth = done * self.PLAIN_LINES_PER_STEP // total if total else 0
        if text == self._text and tenth == self._shown:
            return
        self._text, self._shown = text, tenth
        line = f"{self.label}: {text}" + (f" ({done}/{total})" if total else "")
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def steps(label: str, console: Console | None = None) -> Iterator[Steps]:
    """``with steps("polar export") as progress: progress.step("writing", i, n)``: see :class:`Steps`."""
    console = console or stderr_console()
    if not console.is_terminal:
        yield Steps(label, console, None)
        return
    with progress_bar(console, "step") as progress:
        yield Steps(label, console, progress)
