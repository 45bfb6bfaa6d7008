"""``polar replay`` with the real pi CLI: a multi-turn pi session (the scripted backend plays the model, with tool
calls) becomes a script; ``polar run`` with that script makes pi send the proxy the same requests, turn for turn, and
gets the same answers; a run whose requests differ fails on the first one, naming where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar_cli.harnesses.testing import RunReport, check_run, polar_run_file, require_cli, run_task
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.proxy.backends.script_check import SESSION_PATH, mask_session

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]


def call(name: str, **arguments: Any) -> list[dict[str, Any]]:
    """One tool call, without an id: the scripted backend derives it from the session id (the replay must carry it)."""
    return [{"function": {"name": name, "arguments": arguments}}]


SCRIPT = [
    {"content": None, "tool_calls": call("bash", command="printf 'one\\ntwo\\n' > notes.txt && cat notes.txt")},
    {"content": "Let me look at it.", "tool_calls": call("read", path="notes.txt")},
    {"content": None, "reasoning_content": "One line is missing.",
     "tool_calls": call("write", path="notes.txt", content="one\ntwo\nthree\n")},
    {"content": None, "tool_calls": call("bash", command="wc -l < notes.txt")},
    {"content": "notes.txt has three lines."},
]  # fmt: skip


def task(folder: Path, **changes: Any) -> Path:
    """pi writes notes.txt in four tool calls; ``test_on_output`` checks it has three lines. No script unless
    ``changes`` give one in the metadata."""
    data = run_task("pi")
    data.update(task_id="replay-pi", instruction="Write notes.txt with the lines one, two and three, then check it.",
                evaluator={"strategy": "test_on_output", "config": {"command": 'test "$(wc -l < notes.txt)" = 3'}},
                metadata={})  # fmt: skip
    data.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "task.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def polar(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The original pi run, ``polar replay`` of its results file, and a second run playing the replay."""
    require_cli("pi")
    root = tmp_path_factory.mktemp("replay")
    first = root / "first"
    original = polar_run_file(task(first, metadata={SCRIPT_KEY: SCRIPT}), first)[0]
    check_run(original)
    replayed = polar("replay", "out.jsonl", "--out", str(root / "replay.yaml"), cwd=first)
    assert replayed.returncode == 0, replayed.stderr
    second = root / "second"
    again = polar_run_file(task(second), second, "--script", str(root / "replay.yaml"))[0]
    return {"root": root, "original": original, "again": again, "stderr": replayed.stderr}


def requests(report: RunReport) -> list[dict[str, Any]]:
    """Each call's normalized request, its session's own paths masked."""
    return [{"messages": mask_session(c.request_messages, c.session_id), "tools": c.request_tools}
            for c in report.completions]  # fmt: skip


def test_the_replayed_run_sends_the_same_requests_and_gets_the_same_answers(runs: dict[str, Any]) -> None:
    original, again = runs["original"], runs["again"]
    check_run(again)
    assert len(original.completions) == len(again.completions) == len(SCRIPT)
    assert again.result is not None and original.result is not None
    assert again.result.session_id != original.result.session_id
    assert requests(again) == requests(original)  # turn for turn, pi's working directory aside
    system = original.completions[0].request_messages[0]["content"]
    assert original.result.session_id in system  # what the mask is for: pi names its session's directory
    assert SESSION_PATH in requests(original)[0]["messages"][0]["content"]
    for a, b in zip(original.completions, again.completions, strict=True):
        assert b.response_message == a.response_message  # text, reasoning, tool calls and their ids
        assert (b.response_ids, b.response_logprobs, b.finish_reason) == (a.response_ids, a.response_logprobs,
                                                                          a.finish_reason)  # fmt: skip


def test_the_script_holds_each_call_and_its_request(runs: dict[str, Any]) -> None:
    script = yaml.safe_load((runs["root"] / "replay.yaml").read_text())
    original = runs["original"].completions
    assert [t["tool_calls"][0]["id"] for t in script[:4]] == [c.response_message["tool_calls"][0]["id"]
                                                               for c in original[:4]]  # fmt: skip
    assert script[2]["reasoning_content"] == "One line is missing."
    assert [t["expect"]["messages"] for t in script] == [r["messages"] for r in requests(runs["original"])]
    assert "5 turns replaying session" in runs["stderr"]


def test_check_compares_two_journals_and_a_results_file_names_its_session(runs: dict[str, Any]) -> None:
    root, original, again = runs["root"], runs["original"], runs["again"]
    first_journal = root / "first" / "polar-data" / "journal" / f"{original.result.session_id}.jsonl"
    second_journal = root / "second" / "polar-data" / "journal" / f"{again.result.session_id}.jsonl"
    checked = polar("replay", str(first_journal), "--check", str(second_journal), cwd=root)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == "the replay matches: 5 calls, the same requests in the same order"
    by_session = polar("replay", "first/out.jsonl", "--session", original.result.session_id, cwd=root)
    by_journal = polar("replay", str(first_journal), cwd=root)
    assert by_session.returncode == by_journal.returncode == 0, by_session.stderr + by_journal.stderr
    assert yaml.safe_load(by_session.stdout) == yaml.safe_load(by_journal.stdout)
    wrong = polar("replay", "first/out.jsonl", "--session", "nope", cwd=root)
    assert wrong.returncode == 2  # a ConfigError: one line, no traceback
    assert wrong.stderr == f"Error: first/out.jsonl: no session 'nope' (it holds {original.result.session_id})\n"


def test_a_run_whose_requests_differ_fails_at_the_first_naming_where(runs: dict[str, Any]) -> None:
    root = runs["root"]
    third = root / "third"
    report = polar_run_file(task(third, instruction="Write notes.txt."), third, "--script", str(root / "replay.yaml"))
    result = report[0].result
    assert result is not None and result.status == "error", report[0].describe()
    assert "scripted replay: session " in (result.error or "")
    assert 'call 1: message 1 (user).content: original "Write notes.txt with the lines' in (result.error or "")
    journal = third / "polar-data" / "journal" / f"{result.session_id}.jsonl"
    checked = polar("replay", "first/out.jsonl", "--check", str(journal), cwd=root)
    assert checked.returncode == 1
    assert "the replay diverged at call 1: the replay made 0 calls, the original 5" in checked.stderr
