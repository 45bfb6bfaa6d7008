"""``polar generate --dataset NAME [--out DIR]``: run a dataset's tasks on the rollout service (embedded, or
``--server URL``) into a resumable folder, with live progress and a per-group acceptance table."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from polar_cli.commands import backend_options
from polar_cli.commands.flags import positive_seconds
from polar_cli.commands.interrupt import Interrupted, run_until_stopped
from polar_cli.commands.output import JsonOption, emit_json, progress_bar, stderr_console, stdout_console, steps
from polar_cli.commands.retention_options import (
    RetentionMaxAge,
    RetentionMaxBytes,
    RetentionModeOption,
    retention_flags,
)
from polar_cli.commands.reward_tables import reward_table
from polar_cli.commands.run import summary_table
from polar_cli.config import read_data_file, set_dotted
from polar_cli.errors import ConfigError
from polar_cli.gateway import backend_check
from polar_cli.gateway.config import PipelineConfig
from polar_cli.generate import (
    GenerateOptions,
    GenerateProgress,
    GroupStats,
    ResultRow,
    embedded_serve_config,
    generate,
    group_stats,
)
from polar_cli.generate.ledger import LEDGER, open_ledger
from polar_cli.launch import ServeInfo
from polar_cli.models import SessionResult, validate_model
from polar_cli.registry import get_harness
from polar_cli.server.retention import RetentionConfig


def parse_dataset_options(path: Path | None, pairs: list[str]) -> dict[str, Any]:
    """``--dataset-config FILE`` (a YAML/JSON mapping) with each ``--dataset-option key=value`` on top (dotted keys
    nest; values are read as YAML scalars/lists: ``limit=3``, ``tasks=[a, b]``)."""
    data: Any = read_data_file(path) if path is not None else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: dataset options are one mapping, not {type(data).__name__}")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--dataset-option {pair!r}: use key=value")
        try:
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            parsed = value
        set_dotted(data, {key: parsed}, source="--dataset-option")
    return data


def default_out(dataset: str, harness: str | None) -> Path:
    """``--out``'s default: ``<dataset>-<harness>`` (``<dataset>`` without ``--harness``) in the current folder."""
    name = f"{dataset}-{harness}" if harness else dataset
    return Path(name.replace("/", "_"))


def group_table(stats: list[GroupStats], group_by: str) -> Table:
    """The paper's Table 2: per group, attempts, accepted and the acceptance rate."""
    table = Table(title=f"acceptance by {group_by}")
    for column in (group_by, "tasks", "sessions", "attempts", "accepted", "rate", "failed", "trainable tokens",
                   "turns/session"):  # fmt: skip
        table.add_column(column, justify="left" if column == group_by else "right")
    for s in stats:
        style = "bold" if s is stats[-1] else ""
        table.add_row(s.group, str(s.tasks), str(s.sessions), str(s.attempts), str(s.accepted), f"{s.rate:.1%}",
                      str(s.failed), str(s.trainable_tokens), f"{s.mean_turns:.1f}", style=style)  # fmt: skip
    return table


def rewards_table(stats: list[GroupStats], group_by: str) -> Table:
    """Per group (the total last): reward mean and std, zero-variance task groups, pass@k (accepted = correct)."""
    return reward_table(f"rewards by {group_by}", [([s.group, str(s.tasks)], s.rewards) for s in stats],
                        [group_by, "tasks"], bold_last=True)  # fmt: skip


def generate_command(
    dataset: str = typer.Option(..., "--dataset", help="Dataset plugin: demo, tasks_file, hf, ..."),
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Output folder (ledger.db, service data); resumable.",
                     show_default="DATASET-HARNESS"),
    ] = None,
    dataset_option: Annotated[
        list[str] | None,
        typer.Option("--dataset-option", "-O", help="A dataset option key=value (repeatable; dotted keys nest)."),
    ] = None,
    dataset_config: Annotated[Path | None, typer.Option("--dataset-config", help="Dataset options, YAML.")] = None,
    harness: str | None = typer.Option(None, "--harness", help="Override agent.harness (e.g. pi)."),
    model: str | None = typer.Option(None, "--model", help="Override agent.model_name; upstream model name."),
    samples: int | None = typer.Option(None, "--samples", min=1, help="Sessions per task (num_samples)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="The first N tasks only."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Sessions in flight at once."),
    max_retries: int = typer.Option(
        1, "--max-retries", min=0, help="Re-runs of a session that errs or yields no tokens."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", callback=positive_seconds, help="Override timeout_seconds per session."
    ),
    builder: str | None = typer.Option(None, "--builder", help="Override builder.strategy."),
    group_by: str = typer.Option("repo", "--group-by", help="Task metadata field the table groups by."),
    accept_min_reward: float = typer.Option(1.0, "--accept-min-reward", help="Reward at which a session counts."),
    server: str | None = typer.Option(
        None, "--server", help="A running polar serve (default: embedded, with the backend options below)."
    ),
    token: str | None = typer.Option(None, "--token", envvar="POLAR_TOKEN", help="--server's token."),
    backend: backend_options.Backend = "scripted",
    backend_url: backend_options.BackendUrl = None,
    tokenizer: backend_options.Tokenizer = None,
    backend_timeout: backend_options.BackendTimeout = None,
    backend_retries: backend_options.BackendRetries = None,
    backend_check_timeout: backend_options.BackendCheckTimeout = None,
    stream_mode: backend_options.StreamMode = "passthrough",
    token_mode: backend_options.TokenModeOption = None,
    run_slots: int | None = typer.Option(None, "--run-slots", min=1, help="Embedded: harnesses at once (default: C)."),
    install: bool = typer.Option(True, "--install/--no-install", help="Install the harness's CLI if missing."),
    retention_max_age: RetentionMaxAge = None,
    retention_max_bytes: RetentionMaxBytes = None,
    retention_mode: RetentionModeOption = None,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log warnings from the service."),
    as_json: bool = JsonOption,
) -> None:
    """Generate rollouts for a dataset's tasks into DIR; run it again to resume after a crash, Ctrl-C or SIGTERM.

    Exits 1 when no session completed, 130/143 when stopped by Ctrl-C/SIGTERM (the next run resumes), else 0."""
    logging.basicConfig(level=logging.WARNING if verbose else logging.CRITICAL, format="%(levelname)s %(message)s")
    logging.getLogger(backend_check.__name__).setLevel(logging.WARNING)  # a wait for a busy backend is always said
    console = stderr_console()
    if out is None:
        out = default_out(dataset, harness)
        console.print(f"output folder: {out} (no --out: named after the dataset and harness; the same command resumes "
                      "it)", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    options = validate_model(GenerateOptions, {
        "dataset": dataset, "dataset_options": parse_dataset_options(dataset_config, dataset_option or []),
        "harness": harness, "model": model, "samples": samples, "limit": limit, "concurrency": concurrency,
        "max_retries": max_retries, "timeout_seconds": timeout, "builder": builder, "group_by": group_by,
        "accept_min_reward": accept_min_reward}, source="polar generate")  # fmt: skip
    retention = retention_flags(retention_max_age, retention_max_bytes, retention_mode)
    if server is not None and retention:
        raise ConfigError("--retention-* set the embedded service's retention: with --server, give them to that "
                          "polar serve")  # fmt: skip
    target: Any = server
    if server is None:
        overrides = backend_options.proxy_overrides(
            backend=backend, backend_url=backend_url, model=model, tokenizer=tokenizer,
            backend_timeout=backend_timeout, backend_retries=backend_retries, stream_mode=stream_mode,
            token_mode=token_mode, backend_check_timeout=backend_check_timeout,
        )  # fmt: skip
        proxy = backend_options.proxy_config(overrides, source="polar generate")
        proxy.backend_config()
        slots = run_slots or concurrency
        pipeline = validate_model(PipelineConfig, {"run_slots": slots, "init_workers": slots, "postrun_workers": slots},
                                  source="polar generate")  # fmt: skip
        kept = validate_model(RetentionConfig, retention, source="polar generate --retention-*")
        target = embedded_serve_config(out, proxy, pipeline, kept)
    if server is None and harness is not None:
        agent = get_harness(harness)
        if not agent.is_installed() and agent.version:
            if not install:
                raise ConfigError(f"harness {agent.name!r} is not installed: polar harness install {agent.name}")
            with steps("polar generate", console) as installing:
                installing.step(f"installing {agent.name} {agent.version}")
                agent.install()

    interrupted: Interrupted | None = None
    with progress_bar(console, "counts", eta=True) as progress:
        bar = progress.add_task("generate", total=None, counts="starting")

        def started(info: ServeInfo | None) -> None:
            where = f"embedded service {info.url}" if info else f"service {server}"
            progress.console.print(f"{where}; output: {out}")

        def update(p: GenerateProgress) -> None:
            rate = p.accepted / p.done if p.done else 0.0
            counts = (f"accepted {p.accepted} ({rate:.0%}) · failed {p.failed} · retries {p.retries} · "
                      f"running {p.in_flight}" + (f" · resumed {p.resumed}" if p.resumed else ""))  # fmt: skip
            progress.update(bar, total=p.total, completed=p.done, counts=counts)

        try:
            run_until_stopped(generate(options, out, server=target, token=token, on_start=started, on_progress=update))
        except Interrupted as stop:
            interrupted = stop
    if interrupted is not None and not (out / LEDGER).is_file():
        console.print(f"interrupted ({interrupted.name}) before anything ran; nothing was written to {out}")
        raise typer.Exit(interrupted.exit_code)
    rows, failed, harnesses = finished_sessions(out)
    by_harness = group_stats(rows, by=harnesses)
    if as_json:
        emit_json(summary(out, group_by, rows, failed, by_harness))
    report(out, group_by, rows, failed, by_harness, console if as_json else stdout_console())
    if interrupted is not None:
        console.print(
            f"interrupted ({interrupted.name}): the {len(rows)} sessions that finished are kept in {out}; run the "
            "same command again to resume (finished sessions are not run again).",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        raise typer.Exit(interrupted.exit_code)
    if not any(r.status == "completed" for r in rows):
        console.print(f"no session completed (see the failed sessions above; their results are in {out})",
                      markup=False, highlight=False, soft_wrap=True)  # fmt: skip
        raise typer.Exit(1)


def finished_sessions(out: Path) -> tuple[list[ResultRow], list[SessionResult], dict[str, str]]:
    """Every final result's summary row in ``out``'s ledger, the SessionResults of those that did not complete, and
    each task's harness (read once, for the tables and ``--json`` alike)."""
    with open_ledger(out, must_exist=True) as ledger:
        rows = ledger.rows()
        failed = [
            SessionResult.model_validate_json(blob) for row, blob in ledger.results() if row.status != "completed"
        ]
        harnesses = ledger.harnesses()
    return rows, failed, harnesses


def _stats_json(s: GroupStats) -> dict[str, Any]:
    return {"group": s.group, "tasks": s.tasks, "sessions": s.sessions, "attempts": s.attempts,
            "accepted": s.accepted, "rate": s.rate, "failed": s.failed, "trainable_tokens": s.trainable_tokens,
            "mean_turns": s.mean_turns, "rewards": s.rewards.model_dump(mode="json")}  # fmt: skip


def summary(out: Path, group_by: str, rows: list[ResultRow], failed: list[SessionResult],
            by_harness: list[GroupStats]) -> dict[str, Any]:  # fmt: skip
    """``--json``'s document: the folder, the acceptance and reward statistics per group and per harness (the last of
    each is the total), and every session that did not complete."""
    return {
        "out": str(out), "group_by": group_by, "sessions": len(rows),
        "completed": sum(r.status == "completed" for r in rows), "accepted": sum(r.accepted for r in rows),
        "groups": [_stats_json(s) for s in group_stats(rows)],
        "harnesses": [_stats_json(s) for s in by_harness],
        "failed": [{"session_id": r.session_id, "task_id": r.task_id, "status": r.status, "error": r.error}
                   for r in failed],
    }  # fmt: skip


def report(out: Path, group_by: str, rows: list[ResultRow], failed: list[SessionResult], by_harness: list[GroupStats],
           console: Console) -> None:  # fmt: skip
    """The acceptance table, the reward tables (per group, per harness) and the sessions that failed (with the
    ``polar run`` summary table)."""
    stats = group_stats(rows)
    console.print(group_table(stats, group_by))
    console.print(rewards_table(stats, group_by))
    console.print(rewards_table(by_harness, "harness"))
    if failed:
        table = summary_table(failed[:20])
        table.title = f"failed sessions ({len(failed)}{', first 20' if len(failed) > 20 else ''})"
        console.print(table)
    console.print(f"{len(rows)} sessions in {out} (export: polar export {out} --to DATASET_DIR)")


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_command)
