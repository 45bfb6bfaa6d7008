"""``polar harness list|install``: the pinned harness CLIs in their Polar-managed prefixes."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from polar_cli.commands.output import stdout_console, steps
from polar_cli.harnesses.manage import install_harnesses, list_harnesses

harness_app = typer.Typer(help="List and install harness CLIs (pinned versions, Polar-managed npm prefixes).")


@harness_app.command("list")
def list_command(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Every registered harness: its package, pinned version, whether it is installed, and where."""
    rows = list_harnesses()
    if as_json:
        typer.echo(json.dumps([row.as_dict() for row in rows], indent=2))
        return
    table = Table("harness", "package", "version", "installed", "location")
    for row in rows:
        table.add_row(row.name, row.package, row.version, "yes" if row.installed else "no", row.location)
    stdout_console().print(table)


@harness_app.command("install")
def install_command(
    names: Annotated[list[str] | None, typer.Argument(help="Harness names (see `polar harness list`).")] = None,
    every: bool = typer.Option(False, "--all", help="Install every registered harness."),
    force: bool = typer.Option(False, "--force", help="Reinstall even when present."),
) -> None:
    """Install harness CLIs at their pinned versions (idempotent: present ones are skipped)."""

    with steps("polar harness install") as progress:
        started: list[str] = []

        def step(name: str, state: str) -> None:
            started.append(name)
            progress.step(f"{name}: {state}", len(started) - 1, len(names or []) or None)

        done = install_harnesses(names or [], every=every, force=force, progress=step)
    for name, seconds in done:
        typer.echo(f"{name}: ok ({seconds:.1f} s)")


def register(app: typer.Typer) -> None:
    app.add_typer(harness_app, name="harness")
