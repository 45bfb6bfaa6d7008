"""``polar doctor --harness NAME``: check a harness end to end through a scripted proxy session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from polar_cli.commands.output import stdout_console
from polar_cli.harnesses.doctor import DEFAULT_IMAGE, DoctorReport, run_doctor
from polar_cli.registry import get_harness

MARKS = {"pass": "[green]ok[/green]", "fail": "[red]FAIL[/red]", "skip": "[yellow]--[/yellow]"}


def _print(report: DoctorReport) -> None:
    console = stdout_console()
    table = Table("step", "", "detail", title=f"polar doctor: {report.harness} in the {report.runtime} runtime")
    for step in report.steps:
        table.add_row(step.name, MARKS[step.status], step.detail)
    console.print(table)
    verdict = "[green]all steps passed[/green]" if report.ok else "[red]some steps failed[/red]"
    console.print(f"{verdict} ({report.seconds:.1f} s)")


def doctor(
    harness: str = typer.Option(..., "--harness", help="The harness to check (see `polar harness list`)."),
    runtime: str = typer.Option("local", "--runtime", help="Where it runs: local, docker, ..."),
    image: str = typer.Option(None, "--image", help=f"Container image (docker/apptainer; default {DEFAULT_IMAGE})."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds the harness may run."),
    install: bool = typer.Option(True, "--install/--no-install", help="Install the pinned CLI if it is missing."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    save_requests: Annotated[
        Path | None,
        typer.Option(
            "--save-requests", help="Write the request bodies the harness sent (shortened) to DIR/<harness>/."
        ),
    ] = None,
) -> None:
    """Drive the real harness through a scripted session (one shell-tool call that writes a file, then an answer)
    and report each step. Exits 0 only when every step passes."""
    report = asyncio.run(
        run_doctor(
            get_harness(harness),
            runtime=runtime,
            image=image,
            timeout=timeout,
            install=install,
            save_requests=save_requests,
        )
    )
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print(report)
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
