"""``polar_cli.replay`` without a harness: journals and results files as sources, what a script turn holds, and the
errors that name what to give instead (tests/harnesses/test_replay.py replays a real pi session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import ConfigError
from polar_cli.models import Completion, SessionResult, Trace, Trajectory
from polar_cli.proxy.backends.script_check import SESSION_PATH
from polar_cli.replay import compare_sessions, load_session, replay_script

SID = "task-0-abcd1234"


def completion(index: int, answer: str, user: str = "do it", **message: Any) -> Completion:
    return Completion(
        completion_id=f"c{index}", session_id=SID, index=index, provider="openai_chat", model="m", request={},
        request_messages=[{"role": "system", "content": f"cwd: /tmp/rt/local-{SID}-x1/session"},
                          {"role": "user", "content": user}],
        request_tools=[{"type": "function", "function": {"name": "bash"}}],
        response_message={"role": "assistant", "content": answer, **message}, prompt_ids=[1, 2],
        response_ids=[3, 4], response_logprobs=[-0.5, -0.25], finish_reason="stop", started_at=0.0, finished_at=1.0,
    )  # fmt: skip


def write_journal(folder: Path, completions: list[Completion]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{SID}.jsonl"
    path.write_text("".join(c.model_dump_json() + "\n" for c in completions), encoding="utf-8")
    return path


def write_results(path: Path, *indices_per_session: tuple[str, list[int]]) -> Path:
    results = [SessionResult(session_id=sid, status="completed", num_completions=len(indices),
                             trajectory=Trajectory(status="completed", traces=[Trace(
                                 prompt_ids=[1], response_ids=[2], loss_mask=[1],
                                 metadata={"completion_indices": indices})]))
               for sid, indices in indices_per_session]  # fmt: skip
    path.write_text("".join(r.model_dump_json() + "\n" for r in results), encoding="utf-8")
    return path


def test_a_results_file_replays_its_sessions_last_attempt_only(tmp_path: Path) -> None:
    """A journal holds an earlier attempt of the same session id first (a killed gateway): the result's traces say
    where its own calls begin."""
    write_journal(tmp_path / "polar-data" / "journal", [completion(0, "lost"), completion(1, "lost too"),
                                                        completion(2, "kept", reasoning_content="think")])  # fmt: skip
    results = write_results(tmp_path / "out.jsonl", (SID, [2]))
    recorded = load_session(results)
    assert [c.index for c in recorded.completions] == [2]
    [turn] = replay_script(recorded)
    assert turn["content"] == "kept" and turn["reasoning_content"] == "think" and turn["finish_reason"] == "stop"
    assert (turn["response_ids"], turn["logprobs"]) == ([3, 4], [-0.5, -0.25])
    assert turn["expect"]["messages"][0] == {"role": "system", "content": f"cwd: {SESSION_PATH}"}
    assert len(turn["expect"]["tools_sha256"]) == 64
    assert replay_script(recorded, expect=False, tokens=False) == [
        {"role": "assistant", "content": "kept", "reasoning_content": "think", "finish_reason": "stop"}
    ]
    by_journal = load_session(tmp_path / "polar-data" / "journal" / f"{SID}.jsonl")
    assert [c.index for c in by_journal.completions] == [0, 1, 2]  # a journal alone: all of it


def test_sources_that_cannot_be_replayed_say_what_to_give(tmp_path: Path) -> None:
    results = write_results(tmp_path / "out.jsonl", (SID, [0]), ("other-1-x", [0]))
    with pytest.raises(ConfigError, match=rf"holds 2 sessions: pick one with --session \({SID}, other-1-x\)"):
        load_session(results)
    with pytest.raises(ConfigError, match=rf"no journal of session '{SID}' \(looked for .*polar-data/journal/"):
        load_session(results, session=SID)
    with pytest.raises(ConfigError, match="no file nope: give a results file with --session"):
        load_session("nope", session=SID)
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(ConfigError, match="neither a journal"):
        load_session(tmp_path / "x.jsonl")


def test_compare_names_the_first_call_that_differs(tmp_path: Path) -> None:
    original = load_session(write_journal(tmp_path / "a", [completion(0, "x"), completion(1, "y")]))
    same = load_session(write_journal(tmp_path / "b", [completion(0, "x"), completion(1, "y")]))
    assert compare_sessions(original, same).divergence is None
    other = load_session(write_journal(tmp_path / "c", [completion(0, "x"), completion(1, "y", user="don't")]))
    check = compare_sessions(original, other)
    assert (check.call, check.divergence) == (2, 'message 1 (user).content: original "do it", replay "don\'t"')
    shorter = load_session(write_journal(tmp_path / "d", [completion(0, "x")]))
    assert compare_sessions(original, shorter).divergence == "the replay made 1 calls, the original 2"
