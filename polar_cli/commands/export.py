"""``polar export DIR --to OUT`` (a HuggingFace dataset folder; DIR a generate folder or online data, or
``--server URL --task ID`` instead) and ``polar push-hub OUT REPO_ID``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from polar_cli.commands import sources
from polar_cli.commands.output import JsonOption, emit_json, stdout_console, steps
from polar_cli.commands.sources import ONLINE_HELP, ServerOption, SinceOption, TaskOption, TokenOption
from polar_cli.export import ExportOptions, ExportReport, export
from polar_cli.export.hub import push_to_hub
from polar_cli.inputs import Source
from polar_cli.models import validate_model


def load_hint(to: Path) -> list[str]:
    """How to load and push the dataset: after ``load it:`` runnable Python (the folder's absolute path, and the
    install the import needs as a comment), after ``push it:`` a shell command from where export ran."""
    folder = repr(str(to.resolve()))
    return [
        f"load it: from datasets import load_dataset; traces = load_dataset({folder}, 'traces')"
        "  # needs datasets: pip install 'polar-rl[hf]'",
        f"push it: polar push-hub {shlex.quote(str(to))} USER/NAME",
    ]


def report_document(report: ExportReport, source: Source) -> dict[str, Any]:
    """``--json``: the folder written, each config's rows per split, its files."""
    out = report.out.resolve()
    shown = str(source.resolve()) if isinstance(source, Path) else str(source)
    return {"out": str(out), "source": shown, "configs": report.rows,
            "files": [str(f.resolve().relative_to(out)) for f in report.files]}  # fmt: skip


def export_command(
    to: Annotated[Path, typer.Option("--to", help="The dataset folder to write.")],
    path: Annotated[
        Path | None,
        typer.Argument(help=f"A polar generate output folder, {ONLINE_HELP}.", metavar="PATH", show_default=False),
    ] = None,
    server: ServerOption = None,
    token: TokenOption = None,
    task: TaskOption = None,
    since: SinceOption = None,
    accepted_only: bool = typer.Option(False, "--accepted-only", help="Only accepted sessions."),
    min_reward: float | None = typer.Option(None, "--min-reward", help="Only sessions with at least this reward."),
    keep_rejected: bool = typer.Option(False, "--keep-rejected", help="Filtered-out rows go to a 'rejected' split."),
    test_size: float = typer.Option(0.0, "--test-size", help="Fraction of each group's sessions for a test split."),
    stratify_by: str | None = typer.Option(
        None, "--stratify-by", show_default="repo",
        help="Task metadata field (or task_id) the split stratifies by and the card's tables group by.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the split and of the preference pairs."),
    license: str = typer.Option("other", "--license", help="The dataset card's license."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --to if it exists."),
    threads: int | None = typer.Option(
        None, "--threads", show_default="2, or 1 on a one-CPU machine",
        help="Threads that encode and write the parquet shards.",
    ),
    json_output: bool = JsonOption,
) -> None:
    """Export generated sessions, or an online run's (polar serve), as a HuggingFace dataset: configs 'traces',
    'messages' and 'preferences', parquet, a card."""
    source = sources.source(path, server, token, task, since)
    options = validate_model(ExportOptions, {
        "accepted_only": accepted_only, "min_reward": min_reward, "keep_rejected": keep_rejected,
        "test_size": test_size, "stratify_by": stratify_by, "seed": seed, "license": license,
        "overwrite": overwrite, "threads": threads}, source="polar export")  # fmt: skip
    with steps("polar export") as progress:
        report = export(source, to, options, on_progress=progress.step)
    if json_output:
        emit_json(report_document(report, source))
        for line in load_hint(to):
            typer.echo(line, err=True)
        return
    table = Table(title=f"exported to {to}")
    for column in ("config", "split", "rows"):
        table.add_column(column, justify="right" if column == "rows" else "left")
    for config, splits in report.rows.items():
        for split, rows in sorted(splits.items()):
            table.add_row(config, split, str(rows))
    stdout_console().print(table)
    for line in load_hint(to):
        typer.echo(line)
    for config in empty_configs(report):
        typer.echo(f"note: {config} has no rows, so the card lists no {config!r} config (datasets cannot load a config "
                   f"with no rows: load_dataset(..., {config!r}) answers that it is not found)", err=True)


def empty_configs(report: ExportReport) -> list[str]:
    """The configs written without a row (an empty shard each, left out of the card: ``export.card``)."""
    return [config for config, splits in report.rows.items() if not any(splits.values())]


def push_hub_command(
    folder: Annotated[Path, typer.Argument(help="A folder written by polar export.")],
    repo_id: Annotated[str, typer.Argument(help="The dataset repo, e.g. user/name.")],
    private: bool = typer.Option(False, "--private", help="Create the repo private."),
    token: str | None = typer.Option(None, "--token", help="HuggingFace token (default: HF_TOKEN or the saved one)."),
    exist_ok: bool = typer.Option(False, "--exist-ok", help="Upload into the repo if it already exists."),
) -> None:
    """Upload an exported dataset folder to the HuggingFace Hub and print its URL."""
    with steps("polar push-hub") as progress:
        url = push_to_hub(folder, repo_id, private=private, token=token, exist_ok=exist_ok, on_step=progress.step)
    typer.echo(url)


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
    app.command("push-hub")(push_hub_command)
