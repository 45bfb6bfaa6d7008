"""Reading what ``polar view`` shows: a ``polar run --out`` JSONL of SessionResults, a ``polar generate`` folder
(its ledger), a ``polar export`` dataset folder (parquet), or online data (a ``polar serve`` data dir, tasks on a
running server, a ``polar status TASK --json`` file: read as a generate folder by :mod:`polar_cli.online`), into the
view model. Which is which, and their records, come from :mod:`polar_cli.inputs` (shared with ``polar verify``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from polar_cli.errors import ConfigError
from polar_cli.inputs import ServerTasks, Source, dataset_shards, input_kind, results_records, row_metadata, shard_rows
from polar_cli.models import SessionResult
from polar_cli.view.model import ChainStart, ChainView, SessionView, ViewData

if TYPE_CHECKING:
    from polar_cli.generate.ledger import Ledger


def load_view(path: Source, *, tokenizer: Any = None) -> ViewData:
    """Every session in ``path`` (its kind told by its shape; or tasks on a server); ``tokenizer`` (an HF tokenizer,
    optional) gives the prompt tokens and the tokens without text (mask-0 tokens, datasets) their text."""
    if isinstance(path, ServerTasks):
        view = ViewData(str(path), "server", _online(path))
    else:
        path = Path(path)
        kind = input_kind(path)
        readers = {"results": _results_file, "generate": _generate_folder, "dataset": _dataset_folder,
                   "serve": _online, "status": _online}  # fmt: skip
        view = ViewData(str(path), kind, list(readers[kind](path)))
    if tokenizer is not None:
        for session in view.sessions:
            for chain in session.chains:
                decode_tokens(chain, tokenizer)
    return view


def decode_tokens(chain: ChainView, tokenizer: Any) -> None:
    """Give the prompt and every response token without text the tokenizer's token string (byte-level ones are
    decoded to text by the page, as the backend's are)."""
    chain.prompt_tokens = [str(t) for t in tokenizer.convert_ids_to_tokens(chain.prompt_ids)]
    known = chain.tokens or [None] * len(chain.response_ids)
    missing = [i for i, t in enumerate(known) if t is None]
    if missing:
        texts = tokenizer.convert_ids_to_tokens([chain.response_ids[i] for i in missing])
        for i, text in zip(missing, texts, strict=True):
            known[i] = None if text is None else str(text)
        chain.tokens = known


def session_view(result: SessionResult, *, harness: str | None = None, model: str | None = None,
                 accepted: bool | None = None) -> SessionView:  # fmt: skip
    """One SessionResult as the page shows it."""
    trajectory = result.trajectory
    starts = _chain_starts(trajectory.metadata)
    chains = []
    for number, trace in enumerate(trajectory.traces):
        entries = trace.response_logprobs
        tokens = None if entries is None else [e.get("token") for e in entries]
        chains.append(ChainView(
            prompt_ids=trace.prompt_ids, response_ids=trace.response_ids, loss_mask=trace.loss_mask,
            logprobs=None if entries is None else [e["logprob"] for e in entries],
            tokens=tokens if tokens is not None and any(t is not None for t in tokens) else None,
            prompt_messages=trace.prompt_messages, response_messages=trace.response_messages,
            tools=len(trace.tools or []), role=trace.role, role_reason=trace.role_reason, trainable=trace.trainable,
            context_exact=trace.context_exact,
            reward=trace.reward, finish_reason=trace.finish_reason, start=starts.get(number),
            metadata=trace.metadata,
        ))  # fmt: skip
    first = trajectory.traces[0].metadata if trajectory.traces else {}
    metadata = dict(result.metadata)
    evaluation = metadata.pop("evaluation", None)
    return SessionView(
        session_id=result.session_id, status=result.status, task_id=result.task_id, sample_index=result.sample_index,
        reward=result.reward, harness=harness or first.get("harness") or metadata.get("harness"),
        model=model or first.get("model") or metadata.get("model"), completions=result.num_completions,
        error=result.error or trajectory.error, accepted=accepted,
        evaluation=evaluation if isinstance(evaluation, dict) else None, metadata=metadata,
        trajectory_metadata={k: v for k, v in trajectory.metadata.items() if k != "breaks"},
        stage_seconds=result.stage_seconds, harness_stderr=result.harness_stderr, chains=chains,
    )  # fmt: skip


def _chain_starts(metadata: dict[str, Any]) -> dict[int, ChainStart]:
    starts = {}
    for entry in metadata.get("breaks") or []:
        if isinstance(entry, dict) and isinstance(entry.get("chain"), int):
            starts[entry["chain"]] = ChainStart(
                cause=str(entry.get("cause")), closest_chain=entry.get("closest_chain"),
                common_prefix=entry.get("common_prefix"), closest_prompt_tokens=entry.get("closest_prompt_tokens"),
                completion_index=entry.get("completion_index"), first_difference=_int(entry.get("first_difference")),
                expected_ids=_ids(entry.get("expected_ids")), found_ids=_ids(entry.get("found_ids")),
            )  # fmt: skip
    return starts


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: Any) -> list[int] | None:
    """A break's token run, when it is one (older results have none; foreign data gets no say in the page)."""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def _result(data: Any, where: str) -> SessionResult:
    try:
        return SessionResult.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where_in = ".".join(map(str, first["loc"]))
        raise ConfigError(f"{where}: not a SessionResult ({first['msg']} at {where_in})") from exc


def _results_file(path: Path) -> Iterator[SessionView]:
    """A ``polar run --out`` JSONL (one SessionResult a line); a JSON list of them is read too."""
    for where, record in results_records(path):
        yield session_view(_result(record, where))


def _generate_folder(path: Path) -> Iterator[SessionView]:
    """A ``polar generate`` folder: each final result of its ledger, with its task's harness and model."""
    from polar_cli.generate.ledger import open_ledger

    with open_ledger(path, must_exist=True) as ledger:
        yield from _ledger_sessions(ledger, str(path))


def _online(source: Source) -> list[SessionView]:
    """Online data, read as a generate folder (``polar_cli.online``)."""
    from polar_cli.online import online_ledger

    with online_ledger(source) as ledger:
        return list(_ledger_sessions(ledger, str(source)))


def _ledger_sessions(ledger: Ledger, where: str) -> Iterator[SessionView]:
    agents: dict[str, tuple[str, str | None]] = {}
    for row, blob in ledger.results():
        if row.task_id not in agents:
            agent = ledger.task(row.task_id).agent
            agents[row.task_id] = (agent.harness, agent.model_name)
        harness, model = agents[row.task_id]
        yield session_view(_result(orjson.loads(blob), f"{where} ({row.task_id}#{row.sample_index})"),
                           harness=harness, model=model, accepted=row.accepted)  # fmt: skip


def _dataset_folder(path: Path) -> list[SessionView]:
    """A ``polar export`` folder: the ``traces`` config's rows grouped by session (in order), the ``messages``
    config's conversation beside the session's longest main chain. Datasets keep no token texts, evaluator reports
    or chain breaks; a tokenizer gives the tokens text."""
    needed_by = "polar view on an exported dataset"
    sessions: dict[str, SessionView] = {}
    for file in dataset_shards(path):
        split = file.name.rsplit("-", 1)[0]
        for row in shard_rows(file, needed_by=needed_by):
            session = sessions.get(row["session_id"])
            if session is None:
                session = sessions[row["session_id"]] = SessionView(
                    session_id=row["session_id"], status=row.get("status") or "completed", task_id=row.get("task_id"),
                    sample_index=row.get("sample_index") or 0, reward=row.get("reward"), harness=row.get("harness"),
                    model=row.get("model"), accepted=row.get("accepted"), split=split,
                )  # fmt: skip
            meta = row_metadata(row)
            session.chains.append(ChainView(
                prompt_ids=row["prompt_ids"], response_ids=row["response_ids"], loss_mask=row["loss_mask"],
                logprobs=row.get("response_logprobs"), role=row.get("role"),
                trainable=bool(row.get("trainable", True)), context_exact=row.get("context_exact") is not False,
                finish_reason=row.get("finish_reason"), metadata=meta,
                reward=row.get("reward"),
            ))  # fmt: skip
    for file in dataset_shards(path, "messages"):
        for row in shard_rows(file, needed_by=needed_by):
            found = sessions.get(row["session_id"])
            if found is None or not found.chains:
                continue
            found.completions = row.get("num_turns") or found.completions
            mains = [c for c in found.chains if c.role in (None, "main")] or found.chains
            chain = max(mains, key=lambda c: len(c.prompt_ids) + len(c.response_ids))
            chain.response_messages = [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]
    return list(sessions.values())
