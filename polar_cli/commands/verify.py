"""``polar verify PATH [--recompute --model DIR | --model VERSION=DIR ...]`` (or ``--server URL --task ID`` instead
of PATH): check traces against their journal and, with ``--recompute``, their recorded logprobs against the given
weights (docs/verify.md)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from polar_cli.commands import sources
from polar_cli.commands.output import JsonOption, emit_json, stderr_console, stdout_console
from polar_cli.commands.sources import ONLINE_HELP, ServerOption, SinceOption, TaskOption, TokenOption
from polar_cli.errors import ConfigError
from polar_cli.recompute import (
    KL_ESTIMATOR,
    DeltaStats,
    RecomputeReport,
    StructuralReport,
    check_structure,
    load_traces,
    recompute,
)
from polar_cli.recompute.logprobs import CHUNK_SIZE, TOLERANCES
from polar_cli.recompute.placement import parse_device

PathArgument = Annotated[
    Path | None,
    typer.Argument(
        help=f"A results file (polar run --out), a polar generate folder, an exported dataset, {ONLINE_HELP}.",
        metavar="PATH",
        show_default=False,
    ),
]
Models = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        metavar="DIR|VERSION=DIR",
        help="Weights to recompute with: DIR for every trace, or VERSION=DIR per policy version (repeatable).",
        show_default=False,
    ),
]
DEFAULT_TOLERANCES = ", ".join(f"{dtype} {value:g}" for dtype, value in TOLERANCES.items())
Journal = Annotated[
    Path | None,
    typer.Option(
        "--journal", help="The folder of the sessions' journals (default: found beside PATH).", show_default=False
    ),
]


def parse_models(values: list[str]) -> dict[int | None, Path]:
    """``--model DIR`` (every version) and ``--model VERSION=DIR`` (repeatable) as {version or None: folder}."""
    models: dict[int | None, Path] = {}
    for value in values:
        version: int | None = None
        head, sep, tail = value.partition("=")
        if sep:
            try:
                version = int(head)
            except ValueError:
                raise ConfigError(f"--model {value!r}: VERSION=DIR needs a whole-number policy version before '='"
                                  ) from None  # fmt: skip
            if not tail:
                raise ConfigError(f"--model {value!r}: no folder after '='")
            value = tail
        if version in models:
            which = "a plain --model DIR" if version is None else f"policy version {version}"
            raise ConfigError(f"--model given twice for {which}")
        models[version] = Path(value)
    return models


def _stats_table(title: str, rows: dict[str, DeltaStats]) -> Table:
    table = Table(title=title)
    for column in (title.split()[-1], "traces", "tokens", "max |Δlogprob|", "mean |Δlogprob|", "KL (k3)"):
        table.add_column(column, justify="left" if column == title.split()[-1] else "right")
    for key, s in rows.items():
        table.add_row(key, str(s.traces), str(s.tokens), f"{s.max_abs_dlogprob:.3g}", f"{s.mean_abs_dlogprob:.3g}",
                      f"{s.kl:.3g}")  # fmt: skip
    return table


def _print_structural(structural: StructuralReport, traces: int) -> None:
    console = stdout_console()
    line = (f"structural: {structural.checked} of {traces} trace(s) in {structural.sessions} session(s) checked "
            f"against their journal, {len(structural.violations)} violation(s)")  # fmt: skip
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    for v in structural.violations[:20]:
        console.print(f"  {v.code}: {v.message}", markup=False, highlight=False, soft_wrap=True)
    if structural.without_journal:
        n = len(structural.without_journal)
        line = (f"  not checked: {n} session(s) have no journal of completions here (give one with --journal DIR), "
                f"e.g. {structural.without_journal[0]}")  # fmt: skip
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _print_recompute(report: RecomputeReport) -> None:
    console = stdout_console()
    console.print(_stats_table("by harness", report.by_harness))
    console.print(_stats_table("by role", report.by_role))
    if len(report.by_version) > 1:
        console.print(_stats_table("by policy version", report.by_version))
    if report.worst:
        table = Table(title="worst traces")
        for column in ("trace", "tokens", "max |Δ|", "mean |Δ|", "KL", "failed because"):
            table.add_column(column, justify="left" if column in ("trace", "failed because") else "right")
        for w in report.worst:
            cells = [w.max_abs_dlogprob, w.mean_abs_dlogprob, w.kl]
            table.add_row(w.ref, str(w.tokens), *("-" if c is None else f"{c:.3g}" for c in cells), w.reason or "")
        console.print(table)
    line = (f"recompute: {report.tokens} sampled token(s) of {report.traces} trace(s): max |Δlogprob| "
            f"{report.max_abs_dlogprob:.3g}, mean {report.mean_abs_dlogprob:.3g}, KL {report.kl:.3g} "
            f"({KL_ESTIMATOR}); tolerance {report.tolerance:g} on each trace's mean")  # fmt: skip
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    c = report.compute
    peak = "" if c.peak_gpu_memory_gib is None else f", peak {c.peak_gpu_memory_gib:.1f} GiB on a GPU"
    chunks = f"{c.chunk_size}-token chunks" if c.chunk_size else "one pass a sequence"
    line = (f"compute: {c.device}, {c.dtype}, {chunks}: {c.forward_tokens} token(s) in {c.seconds:.2f} s "
            f"({c.tokens_per_second:.0f} tokens/s){peak}")  # fmt: skip
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def verify_command(
    path: PathArgument = None,
    server: ServerOption = None,
    token: TokenOption = None,
    task: TaskOption = None,
    since: SinceOption = None,
    recompute_logprobs: bool = typer.Option(False, "--recompute", help="Recompute each sampled token's logprob."),
    model: Models = None,
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        min=0.0,
        show_default=False,
        help=f"Most mean |Δlogprob| a trace may have (default: the dtype's; {DEFAULT_TOLERANCES}).",
    ),
    dtype: str = typer.Option("float32", "--dtype", help="The dtype the model runs in (float32, bfloat16, ...)."),
    device: str = typer.Option(
        "auto",
        "--device",
        help="auto (GPUs if torch sees one), cpu, cuda (GPUs: spread when one is too small), cuda:N.",
    ),
    chunk_size: int = typer.Option(
        CHUNK_SIZE, "--chunk-size", min=0, help="Tokens per forward pass, the rest through the KV cache (0: one pass)."
    ),
    journal: Journal = None,
    json_output: bool = JsonOption,
) -> None:
    """Check traces: each session against its journal of completions, and with --recompute each sampled token's
    recorded logprob against the logprob the given weights give it (transformers, on --device).

    Exits 0 when every check passes, 1 when one fails (the worst traces named first), 2 on bad input."""
    source = sources.source(path, server, token, task, since)
    models = parse_models(model or [])
    if recompute_logprobs and not models:
        raise ConfigError("--recompute needs --model DIR (or --model VERSION=DIR per policy version)")
    if models and not recompute_logprobs:
        raise ConfigError("--model is for --recompute: add --recompute")
    if recompute_logprobs:
        from polar_cli.recompute.logprobs import check_dtype, check_model_dir

        check_dtype(dtype)
        parse_device(device)
        for folder in models.values():
            check_model_dir(folder)
        if os.environ.get("POLAR_DEBUG", "") in ("", "0"):
            with contextlib.suppress(ImportError):  # its absence is reported, with the extra to install, by recompute
                from transformers.utils import logging as transformers_logging

                transformers_logging.disable_progress_bar()  # "Loading weights" bars, one per model
    traces = load_traces(source, journal=journal)
    if not traces:
        raise ConfigError(f"{source} holds no trace")
    notes = stderr_console()
    document: dict[str, Any]
    if recompute_logprobs:
        with notes.status(f"recomputing {len(traces)} trace(s)"):
            report = recompute(traces, models, tolerance=tolerance, dtype=dtype, device=device, chunk_size=chunk_size)
        structural, ok = report.structural, report.ok
        document = report.model_dump(mode="json")
    else:
        structural = check_structure(traces)
        if not structural.sessions:
            raise ConfigError(
                f"{source}: no journal of completions for any of its {len(structural.without_journal)} session(s), so "
                "there is nothing to check structurally: give the journals with --journal DIR, or recompute the "
                "logprobs with --recompute --model DIR"
            )
        problems = [f"{t.ref}: {p}" for t in traces for p in t.problems]
        ok = structural.ok and not problems
        document = {"ok": ok, "traces": len(traces), "structural": structural.model_dump(mode="json"),
                    "problems": problems}  # fmt: skip
    for line in [*structural.notes, *document.get("warnings", []), *document.get("skipped", [])]:
        notes.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    if json_output:
        emit_json(document)
    else:
        if recompute_logprobs:
            _print_recompute(report)
        _print_structural(structural, len(traces))
        for line in document.get("problems", []):
            stdout_console().print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        verdict = "ok" if ok else "FAILED"
        if recompute_logprobs and report.scripted:
            verdict += (f" ({report.scripted} trace(s) sampled by the scripted backend not recomputed: its logprobs "
                        "are synthetic, no model's)")  # fmt: skip
        if not ok and recompute_logprobs and report.failed:
            verdict += f": {len(report.failed)} trace(s) failed, worst {report.failed[0]}"
            if inexact := report.failed_context_inexact:
                verdict += (
                    f"; {len(inexact)} of them say context_exact: false: built with the builder's merge: "
                    "prompt_prefix, their later turns follow the history as re-rendered, not as the model sampled "
                    "it (the default merge: exact builds traces whose context is exact)"
                )
        stdout_console().print(verdict, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_command)
