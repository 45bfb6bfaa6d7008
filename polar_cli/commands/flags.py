"""Checks shared by command-line flags: an error names the flag (click's ``Invalid value for '--timeout'``), not the
task file the flag would have been written into."""

from __future__ import annotations

import typer


def positive_seconds(value: float | None) -> float | None:
    """A ``typer.Option`` callback: seconds that must be more than 0 when given."""
    if value is not None and value <= 0:
        raise typer.BadParameter(f"{value:g} is not a number of seconds above 0")
    return value
