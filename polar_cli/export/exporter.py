"""``polar export``: a ``polar generate`` folder (or online data: a ``polar serve`` data dir, tasks on a running server,
a ``polar status TASK --json`` file, read as one by ``polar_cli.online``) to a HuggingFace dataset folder (parquet
shards + README card).

Configs: ``traces`` (token-faithful training traces), ``messages`` (one conversation per session, with the SWE instance
columns of ``polar_cli.export.instance``) and ``preferences`` (accepted / rejected pairs: ``preferences.py``).

Two passes over the ledger: the first reads only the small summary columns (filters, the split, the preference pairs,
the card's stats), the second streams each SessionResult it needs once, in dataset order, into sharded parquet writers.
Memory holds at most ``threads x shard_batches + 1`` record batches per (config, split) (``ShardedWriter``), however
many traces there are, and the messages rows of paired sessions whose partner is not read yet (the ledger's order
keeps a task's sessions together). The folder is written beside ``to`` and renamed into place at the end, so a crash
never leaves half a dataset under ``to``.
"""

from __future__ import annotations

import contextlib
import difflib
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from pydantic import Field

from polar_cli.errors import ConfigError
from polar_cli.export.card import dataset_card
from polar_cli.export.instance import instance_fields, session_fields
from polar_cli.export.preferences import Key, Pair, pair_sessions, preference_row
from polar_cli.export.split import stratified_test_keys
from polar_cli.generate.ledger import ExportedResult, ResultRow, TraceTokens, open_ledger
from polar_cli.generate.stats import group_stats
from polar_cli.inputs import ServerTasks, Source
from polar_cli.models import StrictModel, TaskRequest
from polar_cli.models.task import without_script
from polar_cli.online import export_source, is_online

if TYPE_CHECKING:
    from polar_cli.export.parquet import ShardedWriter

CONFIGS = ("traces", "messages", "preferences")
REJECTED = "rejected"
DEFAULT_STRATUM = "repo"
ExportProgress = Callable[[str, int, int], None]
"""``on_progress(step, done, total)``: what the export is doing; ``done`` of ``total`` sessions while it counts
them (0 and 0 otherwise)."""


class ExportOptions(StrictModel):
    """Which rows, which splits, and the card's license."""

    accepted_only: bool = Field(default=False, description="only accepted sessions")
    min_reward: float | None = Field(default=None, description="only sessions with at least this reward")
    keep_rejected: bool = Field(default=False, description="rows the filters drop go to a 'rejected' split")
    test_size: float = Field(default=0.0, ge=0.0, lt=1.0, description="fraction of each group's sessions for test")
    stratify_by: str | None = Field(
        default=None,
        description="task metadata field (or task_id) the split stratifies and the card's statistics group by (None: "
        "repo, '-' for a task without one); one that no task has is refused",
    )
    seed: int = Field(default=0, description="seed of the split and of the preference pairs")
    license: str = "other"
    overwrite: bool = False
    threads: int | None = Field(
        default=None, ge=1, le=64,
        description="threads that encode and write the parquet shards (None: two, or one on a one-CPU machine)",
    )

    def keeps(self, row: ResultRow) -> bool:
        if self.accepted_only and not row.accepted:
            return False
        return self.min_reward is None or (row.reward is not None and row.reward >= self.min_reward)

    @property
    def group_field(self) -> str:
        """The field the split and the card group by: ``stratify_by``, else ``repo``."""
        return self.stratify_by or DEFAULT_STRATUM

    def describe(self) -> str:
        parts = ["accepted only" if self.accepted_only else "", f"reward >= {self.min_reward}" if
                 self.min_reward is not None else "", "rejected rows kept" if self.keep_rejected else "",
                 f"test split {self.test_size:g} stratified by {self.group_field}, seed {self.seed}" if
                 self.test_size else ""]  # fmt: skip
        return "; ".join(p for p in parts if p) or "every session"


@dataclass
class ExportReport:
    out: Path
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    """config -> split -> rows written."""
    files: list[Path] = field(default_factory=list)
    context_inexact: int = 0
    """``traces`` rows written with ``context_exact`` false (built with ``merge: prompt_prefix``)."""


@dataclass
class TaskInfo:
    """What every row of one task repeats."""

    task_id: str
    instance_id: str
    harness: str
    model: str | None
    policy_version: str | None
    metadata: str
    instance: dict[str, Any]
    """Its SWE instance fields (``polar_cli.export.instance``)."""


def task_info(task: TaskRequest) -> TaskInfo:
    meta = without_script(task.metadata)
    version = meta.get("policy_version")
    instance = instance_fields(task)
    return TaskInfo(task.task_id, instance["instance_id"] or task.task_id, task.agent.harness, task.agent.model_name,
                    None if version is None else str(version),
                    orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS).decode(), instance)  # fmt: skip


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return orjson.dumps(content).decode()


def _message(m: dict[str, Any]) -> dict[str, Any]:
    calls = None
    if m.get("tool_calls"):
        calls = []
        for call in m["tool_calls"]:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            calls.append({"id": call.get("id"), "type": call.get("type", "function"), "function": {
                "name": fn.get("name"), "arguments": args if isinstance(args, str) or args is None
                else orjson.dumps(args).decode()}})  # fmt: skip
    return {"role": m.get("role"), "content": _text(m.get("content")), "reasoning_content": m.get("reasoning_content"),
            "tool_calls": calls, "tool_call_id": m.get("tool_call_id"), "name": m.get("name")}  # fmt: skip


def _ids(row: ResultRow, info: TaskInfo) -> dict[str, Any]:
    return {"session_id": row.session_id, "task_id": row.task_id, "instance_id": info.instance_id,
            "sample_index": row.sample_index, "group": row.group, "harness": info.harness, "model": info.model,
            "policy_version": info.policy_version, "status": row.status, "accepted": row.accepted,
            "reward": row.reward}  # fmt: skip


def trace_rows(row: ResultRow, info: TaskInfo, result: dict[str, Any],
               tokens: list[TraceTokens] | None = None) -> Iterator[tuple[dict[str, Any], int]]:  # fmt: skip
    """``traces`` rows of one session (with their token counts). ``tokens``: the traces' token fields as arrays
    (the ledger's ``result_tokens``; ``result`` then lacks them); None: they are read from ``result``'s JSON."""
    ids = _ids(row, info)
    for chain, trace in enumerate(result["trajectory"]["traces"]):
        metadata = {**trace.get("metadata", {}), "task_id": row.task_id}
        if tokens is None:
            entries = trace.get("response_logprobs")
            columns = {"prompt_ids": trace["prompt_ids"], "response_ids": trace["response_ids"],
                       "loss_mask": trace["loss_mask"],
                       "response_logprobs": None if entries is None else [e["logprob"] for e in entries]}  # fmt: skip
        else:
            t = tokens[chain]
            columns = {"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "loss_mask": t.loss_mask,
                       "response_logprobs": t.response_logprobs}  # fmt: skip
        yield {
            **ids, "chain_index": chain, "finish_reason": trace.get("finish_reason"), **columns,
            "policy_versions": trace.get("policy_versions"), "role": trace.get("role"),
            "trainable": trace.get("trainable", True), "context_exact": trace.get("context_exact", True),
            "metadata": orjson.dumps(metadata, option=orjson.OPT_NON_STR_KEYS).decode(),
        }, len(columns["prompt_ids"]) + len(columns["response_ids"])  # fmt: skip


def message_row(row: ResultRow, info: TaskInfo, result: dict[str, Any]) -> dict[str, Any]:
    """The ``messages`` row of one session: its main conversation (the trace with the most messages), its instance
    columns and grade."""
    traces = result["trajectory"]["traces"]
    main = max(traces, key=lambda t: len(t.get("prompt_messages", [])) + len(t.get("response_messages", [])),
               default=None)  # fmt: skip
    messages = [] if main is None else [*main.get("prompt_messages", []), *main.get("response_messages", [])]
    tools = None if main is None or main.get("tools") is None else orjson.dumps(main["tools"]).decode()
    evaluation = (result.get("metadata") or {}).get("evaluation")
    return {**_ids(row, info), "messages": [_message(m) for m in messages], "tools": tools,
            "num_turns": result.get("num_completions", 0), "metadata": info.metadata,
            **session_fields(info.instance, evaluation)}  # fmt: skip


class ExportSource(Protocol):
    """What export reads: a ``Ledger`` (``bench/export.py`` streams synthetic results through the same interface)."""

    def rows(self) -> list[ResultRow]: ...

    def export_results(self, rows: Iterable[ResultRow]) -> Iterator[ExportedResult]: ...

    def task(self, task_id: str) -> TaskRequest: ...

    def task_field(self, field: str) -> dict[str, str]: ...

    def harnesses(self) -> dict[str, str]: ...


@dataclass
class Plan:
    """What the second pass writes, from the summary columns alone."""

    rows: list[ResultRow]
    """Every session of the ledger, in dataset order."""
    strata: dict[str, str]
    """Each task's ``stratify_by`` value."""
    split: dict[Key, str]
    """Each exported session's split."""
    pairs: list[Pair]
    """The preference pairs written (their chosen session exported to train or test)."""

    def streamed(self) -> list[ResultRow]:
        """The sessions whose results the second pass reads: the exported ones and the paired ones."""
        wanted = set(self.split) | {key for p in self.pairs for key in (p.chosen, p.rejected)}
        return [r for r in self.rows if (r.task_id, r.sample_index) in wanted]


def check_stratum_field(ledger: ExportSource, field: str, strata: dict[str, str]) -> None:
    """ConfigError when no task has ``field`` (every stratum would be ``-``), with a close spelling among the
    metadata fields the tasks do have."""
    if field == "task_id" or not strata or any(value != "-" for value in strata.values()):
        return
    fields = sorted({key for task_id in strata for key in without_script(ledger.task(task_id).metadata)})
    close = difflib.get_close_matches(field, [*fields, "task_id"], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    have = f"their metadata fields: {', '.join(fields)}, or task_id" if fields else "they have no metadata: task_id"
    raise ConfigError(f"--stratify-by {field!r}: no task has that metadata field{hint}; {have}")


def _plan(ledger: ExportSource, options: ExportOptions) -> Plan:
    rows = ledger.rows()
    strata = ledger.task_field(options.group_field)
    if options.stratify_by is not None:  # the default, repo, falls back to '-' for tasks without one
        check_stratum_field(ledger, options.stratify_by, strata)
    kept = [r for r in rows if options.keeps(r)]
    test = stratified_test_keys([((r.task_id, r.sample_index), strata.get(r.task_id, "-")) for r in kept],
                                options.test_size, options.seed) if options.test_size else set()  # fmt: skip
    plan = {(r.task_id, r.sample_index): "test" if (r.task_id, r.sample_index) in test else "train" for r in kept}
    if options.keep_rejected:
        plan.update({(r.task_id, r.sample_index): REJECTED for r in rows if not options.keeps(r)})
    pairs = [p for p in pair_sessions(rows, options.seed) if plan.get(p.chosen) in ("train", "test")]
    return Plan(rows, strata, plan, pairs)


def split_counts(exported: Iterable[ResultRow], plan: Plan) -> dict[str, dict[str, int]]:
    """Exported sessions per stratum and split."""
    counts: dict[str, dict[str, int]] = {}
    for r in exported:
        per = counts.setdefault(plan.strata.get(r.task_id, "-"), {})
        split = plan.split[(r.task_id, r.sample_index)]
        per[split] = per.get(split, 0) + 1
    return {stratum: counts[stratum] for stratum in sorted(counts)}


def export(source: Source | ExportSource, to: Path, options: ExportOptions | None = None, *,
           batch_rows: int = 512, on_progress: ExportProgress | None = None) -> ExportReport:  # fmt: skip
    """Write ``source``'s final results (a ``polar generate`` folder, or online data: see ``polar_cli.online``) as a
    HuggingFace dataset folder at ``to`` (MissingDependencyError, before anything is read, without pyarrow: the
    ``hf`` extra)."""
    from polar_cli.export.parquet import ShardedWriter, default_threads

    progress = on_progress or (lambda step, done, total: None)
    options = options or ExportOptions()
    occupied = to.exists() and (not to.is_dir() or any(to.iterdir()))
    if occupied and not options.overwrite:
        raise ConfigError(f"{to} exists and is not empty (--overwrite replaces it)")
    staging = to.with_name(f".{to.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.ExitStack() as stack:
        progress(f"reading {source}", 0, 0)
        ledger: ExportSource
        if isinstance(source, ServerTasks) or (isinstance(source, Path) and is_online(source)):
            ledger = stack.enter_context(export_source(source))
        elif isinstance(source, Path):
            ledger = stack.enter_context(open_ledger(source, must_exist=True))
        else:
            ledger = source
        plan = _plan(ledger, options)
        streamed = plan.streamed()
        writing = f"writing {len(streamed)} sessions"
        progress(writing, 0, len(streamed))
        writers: dict[tuple[str, str], ShardedWriter] = {}

        def writer(config: str, split: str) -> ShardedWriter:
            key = (config, split)
            if key not in writers:
                threads = options.threads or default_threads()
                writers[key] = ShardedWriter(staging, config, split, batch_rows=batch_rows, threads=threads)
                stack.callback(writers[key].abort)  # an export that fails stops every writer's threads
            return writers[key]

        for config in CONFIGS:
            writer(config, "train")  # always present, even when empty
        partner = {key: pair for pair in plan.pairs for key in (pair.chosen, pair.rejected)}
        waiting: dict[Key, dict[str, Any]] = {}  # messages rows of paired sessions whose partner is not read yet
        info: TaskInfo | None = None
        report = ExportReport(out=to)
        for done, (row, blob, tokens) in enumerate(ledger.export_results(streamed), 1):
            key = (row.task_id, row.sample_index)
            if info is None or info.task_id != row.task_id:
                info = task_info(ledger.task(row.task_id))
            result = orjson.loads(blob)
            messages = message_row(row, info, result)
            if (split := plan.split.get(key)) is not None:
                traces = writer("traces", split)
                for values, count in trace_rows(row, info, result, tokens):
                    traces.add(values, count)
                    report.context_inexact += values["context_exact"] is False
                writer("messages", split).add(messages)
            if (pair := partner.get(key)) is not None:
                waiting[key] = messages
                if pair.chosen in waiting and pair.rejected in waiting:
                    preference = preference_row(waiting.pop(pair.chosen), waiting.pop(pair.rejected))
                    writer("preferences", plan.split[pair.chosen]).add(preference)
            progress(writing, done, len(streamed))
        progress("writing the dataset card", 0, 0)
        for w in writers.values():
            w.close()
            report.rows.setdefault(w.config, {})[w.split] = w.rows
        exported = [r for r in plan.rows if (r.task_id, r.sample_index) in plan.split]
        card = dataset_card(license=options.license, splits=report.rows, stats=group_stats(
            replace(r, group=plan.strata.get(r.task_id, "-")) for r in plan.rows), group_by=options.group_field,
            per_split=split_counts(exported, plan), source=str(source), filters=options.describe(),
            context_inexact=report.context_inexact,
            harness_stats=group_stats(plan.rows, by=ledger.harnesses()))  # fmt: skip
        (staging / "README.md").write_text(card, encoding="utf-8")
    if to.exists():
        shutil.rmtree(to) if to.is_dir() else to.unlink()
    staging.rename(to)
    report.files = sorted(p for p in to.rglob("*") if p.is_file())
    progress(f"done: {len(report.files)} files in {to}", 0, 0)
    return report
