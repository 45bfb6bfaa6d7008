"""What every command prints with: the stdout console (tables never cut to 80 columns in a pipe or a file), the
stderr console for human text, and ``--json`` (one JSON document on stdout)."""

from __future__ import annotations

import sys
from typing import Any

import orjson
import typer
from pydantic import BaseModel
from rich.console import Console

# Wide enough that no table cell is ever truncated when stdout is a pipe or a file (rich's default there is 80);
# tables are not expanded, so they take only the width they need.
PIPE_WIDTH = 100_000

JsonOption = typer.Option(False, "--json", help="Print one JSON document on stdout (human text goes to stderr).")


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
