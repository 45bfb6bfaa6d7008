"""``polar replay``: a recorded session as a scripted-backend script, and the check of a replayed run against it.

A session's journal (``<data-dir>/journal/<session>.jsonl``, one Completion per model call, in call order) becomes a
script of one turn per call: the assistant message the harness got (text, reasoning, tool calls with their ids,
finish reason), the sampled token ids and logprobs, and in ``expect`` the request the call was made with. Played by
the scripted backend, the same harness on the same task gets the same answers, and each replayed request is checked
against the original's (``polar_cli/proxy/backends/script_check.py``): the first call that differs fails, naming the
message and field. :func:`compare_sessions` does the same check afterwards, on two journals. See
docs/scripted-backend.md, "Replaying a session".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from polar_cli.errors import ConfigError
from polar_cli.inputs import results_records
from polar_cli.models import Completion, SessionResult
from polar_cli.proxy import journal_path, mask_session, messages_divergence, read_journal, tools_digest

JOURNAL_FOLDERS = ("polar-data/journal", "journal")
"""Where a session's journal is looked for, beside a results file or in the current folder (``polar run``'s
default ``--data-dir`` is ``polar-data``)."""
FINISH_REASONS = ("stop", "length", "tool_calls")


@dataclass(frozen=True)
class RecordedSession:
    """One session's journaled calls, and where they came from."""

    session_id: str
    journal: Path
    completions: list[Completion]


def _first_record(path: Path) -> dict[str, Any] | None:
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                try:
                    data = orjson.loads(line)
                except orjson.JSONDecodeError:
                    return None
                return data if isinstance(data, dict) else None
    return None


def _journal_dirs(base: Path, journal_dir: Path | None) -> list[Path]:
    return [journal_dir] if journal_dir is not None else [base / folder for folder in JOURNAL_FOLDERS]


def _result_in(path: Path, session: str | None) -> SessionResult:
    results = [SessionResult.model_validate(record) for _, record in results_records(path)]
    ids = [r.session_id for r in results]
    if session is not None:
        if session not in ids:
            raise ConfigError(f"{path}: no session {session!r} (it holds {', '.join(ids) or 'none'})")
        return results[ids.index(session)]
    if len(ids) != 1:
        raise ConfigError(f"{path} holds {len(ids)} sessions: pick one with --session ({', '.join(ids)})")
    return results[0]


def first_call(result: SessionResult) -> int | None:
    """The index of the first call a result's traces were built from: a journal holds the calls of an earlier attempt
    of the same session id (one lost with a killed gateway) before them. None when the traces do not say."""
    indices = [i for t in result.trajectory.traces
               for i in (t.metadata.get("completion_indices") or [t.metadata.get("completion_index")])
               if type(i) is int]  # fmt: skip
    return min(indices) if indices else None


def find_session(source: str | Path, *, session: str | None = None, journal_dir: Path | None = None
                 ) -> tuple[Path, int | None]:  # fmt: skip
    """The journal file of ``source``, and the index of the session's first call in it where a result says (else
    None: all of it). ``source`` is a journal itself; a results file (``polar run --out``, one SessionResult a line)
    and the session ``session`` in it (needed when it holds several), whose journal is in ``journal_dir`` or
    ``polar-data/journal`` / ``journal`` beside the file; or a session id, whose journal is in ``journal_dir`` or
    those folders of the current one."""
    path = Path(source)
    first_index = None
    if path.is_file():
        first = _first_record(path)
        empty = first is None and not path.read_bytes().strip()  # a journal whose session made no call
        if empty or (first is not None and "completion_id" in first):
            if session is not None:
                raise ConfigError(f"{path} is a journal (one session's calls): --session is for a results file")
            return path, None
        if first is None or "trajectory" not in first:
            raise ConfigError(f"{path} is neither a journal (<data-dir>/journal/<session>.jsonl) nor a results file "
                              "(polar run --out)")  # fmt: skip
        result = _result_in(path, session)
        session_id, base, first_index = result.session_id, path.parent, first_call(result)
    else:
        if session is not None:
            raise ConfigError(f"no file {path}: give a results file with --session, a journal file, or a session id")
        session_id, base = str(source), Path.cwd()
    folders = _journal_dirs(base, journal_dir)
    for folder in folders:
        if journal_path(folder, session_id).is_file():
            return journal_path(folder, session_id), first_index
    looked = ", ".join(str(journal_path(f, session_id)) for f in folders)
    raise ConfigError(f"no journal of session {session_id!r} (looked for {looked}); give its folder with --journal")


def load_session(source: str | Path, *, session: str | None = None, journal_dir: Path | None = None,
                 allow_empty: bool = False) -> RecordedSession:  # fmt: skip
    """The recorded calls of ``source`` (see :func:`find_session`), in call order; a journal with none is an error
    unless ``allow_empty`` (a replayed run whose first call was refused)."""
    path, first_index = find_session(source, session=session, journal_dir=journal_dir)
    completions = [c for c in read_journal(path) if first_index is None or c.index >= first_index]
    if not completions and not allow_empty:
        raise ConfigError(f"{path}: the journal holds no calls to replay")
    sessions = sorted({c.session_id for c in completions}) or [path.stem]
    if len(sessions) != 1:
        raise ConfigError(f"{path}: calls of several sessions ({', '.join(sessions)}); a journal holds one session's")
    return RecordedSession(sessions[0], path, sorted(completions, key=lambda c: c.index))


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def script_turn(completion: Completion, *, expect: bool = True, tokens: bool = True) -> dict[str, Any]:
    """The scripted-backend turn that answers like ``completion`` did (and, with ``expect``, checks its request)."""
    message = completion.response_message
    turn: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content"))}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        turn["reasoning_content"] = _text(reasoning)
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        arguments = fn.get("arguments", "")
        calls.append({"id": call.get("id"), "type": "function",
                      "function": {"name": fn.get("name", ""), "arguments": arguments}})  # fmt: skip
    if calls:
        turn["tool_calls"] = calls
    if completion.finish_reason in FINISH_REASONS:
        turn["finish_reason"] = completion.finish_reason
    if tokens and completion.response_ids:
        turn["response_ids"] = list(completion.response_ids)
        if completion.response_logprobs is not None and len(completion.response_logprobs) == len(turn["response_ids"]):
            turn["logprobs"] = list(completion.response_logprobs)
    if expect:
        sid = completion.session_id
        turn["expect"] = {
            "messages": mask_session(completion.request_messages, sid),
            "tools_sha256": tools_digest(mask_session(completion.request_tools, sid)),
        }
    return turn


def replay_script(recorded: RecordedSession, *, expect: bool = True, tokens: bool = True) -> list[dict[str, Any]]:
    """The script that replays ``recorded``: one turn per call, in order."""
    return [script_turn(c, expect=expect, tokens=tokens) for c in recorded.completions]


@dataclass(frozen=True)
class ReplayCheck:
    """A replayed session against its original: ``divergence`` is None when every request was the same."""

    original: RecordedSession
    replayed: RecordedSession
    calls: int
    divergence: str | None
    call: int | None = None
    """The first call (1-based) that differs."""


def compare_sessions(original: RecordedSession, replayed: RecordedSession) -> ReplayCheck:
    """Request for request, each session's own paths masked: where the replay first differs, if it does."""
    pairs = list(zip(original.completions, replayed.completions, strict=False))
    for n, (a, b) in enumerate(pairs, 1):
        diverged = messages_divergence(mask_session(a.request_messages, a.session_id),
                                       mask_session(b.request_messages, b.session_id))  # fmt: skip
        if diverged is None and tools_digest(mask_session(a.request_tools, a.session_id)) != tools_digest(
            mask_session(b.request_tools, b.session_id)
        ):
            diverged = "the tool definitions differ from the original's"
        if diverged is not None:
            return ReplayCheck(original, replayed, len(pairs), diverged, n)
    if len(original.completions) != len(replayed.completions):
        diverged = f"the replay made {len(replayed.completions)} calls, the original {len(original.completions)}"
        return ReplayCheck(original, replayed, len(pairs), diverged, len(pairs) + 1)
    return ReplayCheck(original, replayed, len(pairs), None)
