"""Traces as ``polar verify`` reads them, from the three places Polar writes them, each with the journal of
completions it was built from where one is known:

* a results file (``polar run --out results.jsonl``, one SessionResult a line; a JSON list, ``polar run --json``,
  too): journals in ``polar-data/journal`` or ``journal`` beside it, or ``--journal DIR``;
* a ``polar generate`` output folder (``ledger.db``): journals in ``service/journal`` when its service was embedded;
* an exported dataset (``polar export``: a folder whose ``traces/`` holds parquet shards, or one such shard): no
  journal (the ``traces`` config holds no completions) unless ``--journal DIR`` gives one;
* online data, read as a generate folder by :mod:`polar_cli.online`: a ``polar serve`` data dir (journals in its
  ``journal/`` when its gateway ran there: role ``all``), a ``polar status TASK --json`` file (journals found as
  beside a results file), or tasks on a running server (no journal unless ``--journal DIR`` gives one).

A trace that does not validate (its ``response_logprobs`` not aligned with ``response_ids``, say) is still loaded,
unvalidated, with the reason in ``problems``: verify reports it by name instead of refusing the whole file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from polar_cli.errors import ConfigError, PolarError
from polar_cli.inputs import (
    InputKind,
    ServerTasks,
    Source,
    dataset_shards,
    input_kind,
    results_records,
    row_metadata,
    shard_rows,
)
from polar_cli.models import Completion, PolicyVersions, Trace

if TYPE_CHECKING:
    from polar_cli.generate.ledger import Ledger

JOURNAL_CANDIDATES = ("polar-data/journal", "journal", "service/journal")
"""Where a journal folder is looked for, relative to a results file's folder or a generate folder."""


@dataclass
class LoadedTrace:
    """One trace with what names it and, where known, the completions of its session (its journal). A dataclass:
    a trace that did not validate is kept as it is, not validated again."""

    ref: str
    """How a human finds it: ``session S trace I`` (``of task T`` where known)."""
    trace: Trace
    session_id: str | None = None
    task_id: str | None = None
    index: int = 0
    """Its position among its session's traces (an exported row's ``chain_index``)."""
    harness: str | None = None
    role: str | None = None
    completions: list[Completion] | None = None
    """Its session's journal; None where the input carries none."""
    problems: list[str] = field(default_factory=list)
    """Why the trace did not validate (it is then loaded unvalidated); empty for a valid trace."""


def trace_ref(session_id: str | None, index: int, task_id: str | None = None) -> str:
    ref = f"session {session_id or '?'} trace {index}"
    return f"{ref} of task {task_id}" if task_id else ref


def _lenient_trace(data: dict[str, Any]) -> tuple[Trace, list[str]]:
    """``data`` as a Trace; when it does not validate, the trace unvalidated and why (policy_versions still parsed)."""
    try:
        return Trace.model_validate(data), []
    except ValidationError as exc:
        problem = "; ".join(
            (".".join(map(str, e["loc"])) + ": " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        )
    fields = {k: v for k, v in data.items() if k in Trace.model_fields}
    versions = fields.get("policy_versions")
    if isinstance(versions, dict):
        try:
            fields["policy_versions"] = PolicyVersions.model_validate(versions)
        except ValidationError:
            fields["policy_versions"] = None
    fields.setdefault("metadata", {})
    for name in ("prompt_ids", "response_ids", "loss_mask"):
        if not isinstance(fields.get(name), list):
            raise ConfigError(f"a trace without a list of {name}: {problem}")
    return Trace.model_construct(**fields), [problem]


def _session_traces(result: dict[str, Any], source: str) -> Iterator[LoadedTrace]:
    """The traces of one SessionResult (as JSON data), unvalidated ones included."""
    if not isinstance(result, dict) or not isinstance(result.get("trajectory"), dict):
        raise ConfigError(f"{source}: not a SessionResult (no trajectory)")
    session_id = result.get("session_id")
    for index, raw in enumerate(result["trajectory"].get("traces") or []):
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: trace {index} of session {session_id} is not an object")
        trace, problems = _lenient_trace(raw)
        meta = trace.metadata if isinstance(trace.metadata, dict) else {}
        task_id = result.get("task_id") or meta.get("task_id")
        yield LoadedTrace(
            ref=trace_ref(session_id, index, task_id), session_id=session_id, task_id=task_id, index=index,
            harness=meta.get("harness"), role=trace.role, trace=trace, problems=problems,
        )  # fmt: skip


def _results_file(path: Path) -> list[LoadedTrace]:
    return [trace for where, result in results_records(path) for trace in _session_traces(result, where)]


def _generate_folder(path: Path) -> list[LoadedTrace]:
    from polar_cli.generate.ledger import open_ledger

    with open_ledger(path, must_exist=True) as ledger:
        return _ledger_traces(ledger, str(path))


def _online(source: Source) -> list[LoadedTrace]:
    from polar_cli.online import online_ledger

    with online_ledger(source) as ledger:
        return _ledger_traces(ledger, str(source))


def _ledger_traces(ledger: Ledger, where: str) -> list[LoadedTrace]:
    return [t for row, blob in ledger.results() for t in _session_traces(orjson.loads(blob), f"{where} {row.task_id}")]


def _dataset(path: Path) -> list[LoadedTrace]:
    loaded = []
    for file in dataset_shards(path):
        for row in shard_rows(file, needed_by="polar verify on an exported dataset"):
            if "response_ids" not in row or "prompt_ids" not in row:
                raise ConfigError(f"{file}: not a 'traces' shard (no prompt_ids/response_ids columns)")
            logprobs = row.get("response_logprobs")
            meta = row_metadata(row)
            ids = row["response_ids"]
            entries = None
            if logprobs is not None:  # the export keeps the logprobs only: their token ids are the response_ids
                aligned = len(logprobs) == len(ids)
                entries = [{"token": None, "token_id": ids[i] if aligned else -1, "logprob": lp}
                           for i, lp in enumerate(logprobs)]  # fmt: skip
            data = {
                "prompt_ids": row["prompt_ids"], "response_ids": ids, "loss_mask": row["loss_mask"],
                "response_logprobs": entries, "finish_reason": row.get("finish_reason"), "metadata": meta,
                "policy_versions": row.get("policy_versions"), "role": row.get("role"),
                "trainable": row.get("trainable") is not False, "context_exact": row.get("context_exact") is not False,
            }  # fmt: skip
            trace, problems = _lenient_trace(data)
            session_id, task_id, index = row.get("session_id"), row.get("task_id"), row.get("chain_index") or 0
            loaded.append(LoadedTrace(
                ref=trace_ref(session_id, index, task_id), session_id=session_id, task_id=task_id, index=index,
                harness=row.get("harness") or meta.get("harness"), role=trace.role, trace=trace, problems=problems,
            ))  # fmt: skip
    return loaded


def find_journal(path: Source, kind: InputKind | None) -> Path | None:
    """The journal folder that goes with the input at ``path`` (kind None: tasks on a server), if one is there."""
    if kind in ("dataset", None) or isinstance(path, ServerTasks):
        return None
    base = path if path.is_dir() else path.parent
    return next((base / c for c in JOURNAL_CANDIDATES if (base / c).is_dir()), None)


def load_traces(path: str | Source, *, journal: str | Path | None = None) -> list[LoadedTrace]:
    """Every trace of a results file, a ``polar generate`` folder, an exported dataset or online data, in order,
    each with its session's journal (``journal``: the folder of ``<session>.jsonl`` files; default: found beside the
    input, see the module docstring). ConfigError when ``path`` is none of these."""
    from polar_cli.proxy import journal_path, read_journal

    kind: InputKind | None = None
    if isinstance(path, ServerTasks):
        traces = _online(path)
    else:
        path = Path(path)
        kind = input_kind(path)
        readers = {"results": _results_file, "generate": _generate_folder, "dataset": _dataset, "serve": _online,
                   "status": _online}  # fmt: skip
        traces = readers[kind](path)
    folder = Path(journal) if journal is not None else find_journal(path, kind)
    if journal is not None and not folder.is_dir():  # type: ignore[union-attr]
        raise ConfigError(f"--journal {journal}: not a folder")
    if folder is None:
        return traces
    journals: dict[str, list[Completion] | None] = {}
    for loaded in traces:
        sid = loaded.session_id
        if sid is None:
            continue
        if sid not in journals:
            file = journal_path(folder, sid)
            try:
                journals[sid] = read_journal(file) if file.is_file() else None
            except PolarError as exc:
                raise ConfigError(str(exc)) from exc
        loaded.completions = journals[sid]
    return traces
