"""``polar run TASK.yaml|json`` (or flags): run one task's sessions on an embedded gateway and summarize them."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from polar_cli.commands import backend_options
from polar_cli.commands.flags import positive_seconds
from polar_cli.commands.interrupt import Interrupted, run_until_stopped
from polar_cli.commands.output import (
    JsonOption,
    OverwriteOption,
    emit_json,
    progress_bar,
    refuse_existing,
    stderr_console,
    stdout_console,
    steps,
)
from polar_cli.config import read_data_file, set_dotted
from polar_cli.errors import EXIT_FAILED, EXIT_OK, ConfigError
from polar_cli.gateway import backend_check
from polar_cli.gateway.config import GatewayConfig, PipelineConfig
from polar_cli.gateway.embedded import run_embedded
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import SessionResult, TaskRequest, validate_model
from polar_cli.registry import get_harness
from polar_cli.task_check import check_task
from polar_cli.web.auth import CONTROL_TOKEN_ENV, resolve_token

STATUS_STYLE = {
    "completed": "green",
    "timeout": "yellow",
    "limit": "yellow",
    "error": "red",
    "failed": "red",
    "cancelled": "magenta",
    "stale": "magenta",
    "no_model_call": "red",
}


def build_task(path: Path | None, overrides: dict[str, Any]) -> TaskRequest:
    """The task from ``path`` (YAML/JSON) with flag ``overrides`` (dotted keys) applied, or from the flags alone."""
    data: Any = read_data_file(path) if path is not None else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a task file holds one mapping (a TaskRequest), not {type(data).__name__}")
    if path is None:
        data.setdefault("task_id", f"run-{secrets.token_hex(3)}")
    set_dotted(data, overrides, source=str(path or "polar run"))
    return validate_model(TaskRequest, data, source=str(path) if path else "polar run")


FAILED_STATUSES = ("error", "no_model_call")
"""Session statuses that make ``polar run`` and ``polar submit --wait`` exit 1 (docs/cli.md)."""


def any_failed(results: list[SessionResult]) -> bool:
    return any(r.status in FAILED_STATUSES for r in results)


RESULT_COLUMNS = ("status", "reward", "completions", "traces", "trainable tokens", "seconds", "error")


def add_result_columns(table: Table) -> None:
    """The columns ``result_cells`` fills."""
    for column in RESULT_COLUMNS:
        table.add_column(column, justify="left" if column in ("status", "error") else "right")


def styled(status: str) -> str:
    style = STATUS_STYLE.get(status, "")
    return f"[{style}]{status}[/{style}]" if style else status


def result_cells(r: SessionResult) -> list[str]:
    """One SessionResult as the cells of ``RESULT_COLUMNS``."""
    return [
        styled(r.status),
        "-" if r.reward is None else f"{r.reward:g}",
        str(r.num_completions),
        str(len(r.trajectory.traces)),
        str(sum(t.trainable_tokens for t in r.trajectory.traces)),
        f"{r.stage_seconds.get('total', 0.0):.1f}",
        escape((r.error or "").strip()),  # whole: a terminal wraps it, a pipe or file gets it on one line
    ]


def summary_table(results: list[SessionResult]) -> Table:
    """One row per session: status, reward, completions, traces, trainable tokens, seconds, error."""
    table = Table(title="sessions")
    table.add_column("session")
    add_result_columns(table)
    for r in results:
        table.add_row(r.session_id, *result_cells(r))
    return table


def _stages(metrics: dict[str, Any]) -> str:
    s = metrics["stages"]
    return (f"init {s['init']['in_flight']}+{s['init']['queued']} queued · ready {s['ready']['queued']} · "
            f"running {s['running']['in_flight']}/{s['running']['capacity']} · "
            f"postrun {s['postrun']['in_flight']}+{s['postrun']['queued']} queued")  # fmt: skip


def run(
    task_file: Annotated[Path | None, typer.Argument(help="A TaskRequest as YAML or JSON.", show_default=False)] = None,
    harness: str | None = typer.Option(None, "--harness", help="agent.harness (e.g. shell, codex, pi)."),
    instruction: str | None = typer.Option(None, "--instruction", help="The task's instruction."),
    command: str | None = typer.Option(None, "--command", help="agent.config.command (the shell harness)."),
    runtime: str | None = typer.Option(None, "--runtime", help="runtime.backend: local, docker, apptainer."),
    image: str | None = typer.Option(None, "--image", help="runtime.image (docker/apptainer)."),
    samples: int | None = typer.Option(None, "--samples", min=1, help="num_samples: sessions to run."),
    timeout: float | None = typer.Option(
        None, "--timeout", callback=positive_seconds, help="timeout_seconds: the agent's budget per session."
    ),
    builder: str | None = typer.Option(None, "--builder", help="builder.strategy: prefix_merging, per_request."),
    evaluator: str | None = typer.Option(None, "--evaluator", help="evaluator.strategy."),
    backend: backend_options.Backend = "scripted",
    backend_url: backend_options.BackendUrl = None,
    model: backend_options.Model = None,
    tokenizer: backend_options.Tokenizer = None,
    script: backend_options.Script = None,
    backend_timeout: backend_options.BackendTimeout = None,
    backend_retries: backend_options.BackendRetries = None,
    backend_check_timeout: backend_options.BackendCheckTimeout = None,
    stream_mode: backend_options.StreamMode = "passthrough",
    token_mode: backend_options.TokenModeOption = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write one SessionResult per line (JSONL) here.")] = None,
    overwrite: bool = OverwriteOption,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where results/ and journal/ go.")] = Path("polar-data"),
    run_slots: int = typer.Option(8, "--run-slots", min=1, help="Harnesses running at once."),
    init_workers: int = typer.Option(8, "--init-workers", min=1, help="Runtimes starting at once."),
    postrun_workers: int = typer.Option(8, "--postrun-workers", min=1, help="Sessions building/evaluating at once."),
    install: bool = typer.Option(True, "--install/--no-install", help="Install the harness's CLI if it is missing."),
    control_token: str | None = typer.Option(
        None,
        "--control-token",
        help=f"Bearer token of the embedded gateway's control routes (default: ${CONTROL_TOKEN_ENV}, else generated).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log warnings from the gateway."),
    as_json: bool = JsonOption,
) -> None:
    """Run one task's sessions on an embedded gateway: live progress, a summary table, results as JSONL.

    Exits 1 when any session ended with status error or no_model_call, 130/143 when stopped by Ctrl-C/SIGTERM,
    else 0 (docs/cli.md). --out is never replaced without --overwrite. With --json, stdout is one JSON list of the
    SessionResults."""
    logging.basicConfig(level=logging.WARNING if verbose else logging.CRITICAL, format="%(levelname)s %(message)s")
    logging.getLogger(backend_check.__name__).setLevel(logging.WARNING)  # a wait for a busy backend is always said
    if task_file is None and (harness is None or instruction is None):
        raise ConfigError("polar run: give a task file, or at least --harness and --instruction")
    overrides = {
        "agent.harness": harness, "instruction": instruction, "agent.config.command": command,
        "runtime.backend": runtime, "runtime.image": image, "num_samples": samples, "timeout_seconds": timeout,
        "builder.strategy": builder, "evaluator.strategy": evaluator,
    }  # fmt: skip
    if out is not None:
        refuse_existing(out, overwrite, "--out")
    task = build_task(task_file, overrides)
    overrides = backend_options.proxy_overrides(
        backend=backend, backend_url=backend_url, model=model, tokenizer=tokenizer, script=script,
        backend_timeout=backend_timeout, backend_retries=backend_retries, stream_mode=stream_mode,
        token_mode=token_mode, backend_check_timeout=backend_check_timeout,
    )  # fmt: skip
    proxy = backend_options.proxy_config(overrides, source="polar run")
    if task.agent.token_mode is not None:  # the backend check then covers the task's mode
        proxy = proxy.model_copy(update={"token_mode": task.agent.token_mode})
    proxy.backend_config()  # a bad backend combination fails now
    proxy.check_scripted(task.task_id, task.metadata)
    base_dir = task_file.resolve().parent if task_file is not None else None
    check_task(task, base_dir=base_dir, source=str(task_file) if task_file else "polar run")  # before anything starts
    pipeline = validate_model(
        PipelineConfig,
        {"run_slots": run_slots, "init_workers": init_workers, "postrun_workers": postrun_workers},
        source="polar run",
    )
    token, generated = resolve_token(control_token, CONTROL_TOKEN_ENV)
    config = GatewayConfig(
        port=0, data_dir=data_dir, pipeline=pipeline, proxy=proxy, control_token=token, backend_check="fail"
    )
    console = stderr_console()
    agent = get_harness(task.agent.harness)
    if not agent.is_installed() and agent.version:
        if not install:
            raise ConfigError(f"harness {agent.name!r} is not installed: polar harness install {agent.name}")
        with steps("polar run", console) as installing:
            installing.step(f"installing {agent.name} {agent.version}")
            agent.install()

    finished: list[SessionResult] = []
    interrupted: Interrupted | None = None
    with progress_bar(console, "stages") as progress:
        bar = progress.add_task(task.task_id, total=task.num_samples, stages="starting")

        def update(metrics: dict[str, Any], results: list[SessionResult]) -> None:
            finished[:] = results
            progress.update(bar, completed=len(results), stages=_stages(metrics))

        def ready(node: GatewayNode) -> None:
            shown = node.config.control_token if generated else f"from --control-token or ${CONTROL_TOKEN_ENV}"
            line = f"gateway: {node.url}  (control token: {shown})"
            console.print(line, markup=False, highlight=False, soft_wrap=True)

        try:
            results = run_until_stopped(
                run_embedded(task, config, base_dir=base_dir, on_progress=update, on_ready=ready)
            )
        except Interrupted as stop:
            interrupted, results = stop, list(finished)
    results = sorted(results, key=lambda r: (r.sample_index, r.session_id))
    if as_json:
        emit_json(results)
    if results:
        (console if as_json else stdout_console()).print(summary_table(results))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(r.model_dump_json() + "\n" for r in results), encoding="utf-8")
    where = f"results: {out} and {data_dir / 'results'}" if out else f"results: {data_dir / 'results'}"
    if interrupted is not None:
        console.print(
            f"interrupted ({interrupted.name}): {len(results)} of {task.num_samples} sessions kept, unfinished ones "
            f"cancelled with their partial traces; {where}; journals: {data_dir / 'journal'}. polar run does not "
            "resume: run it again to start over (polar generate resumes).",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        raise typer.Exit(interrupted.exit_code)
    console.print(f"{where}; journals: {data_dir / 'journal'}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_FAILED if any_failed(results) else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
