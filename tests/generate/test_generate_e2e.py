"""The README's offline-generation quickstart, verbatim, with the real pi CLI and the scripted backend:
``polar generate`` (killed with SIGKILL mid-run, then run again), ``polar export`` (loaded back with
``datasets.load_dataset`` offline; traces pass ``verify`` against the journals, messages hold the tool calls pi made)
and ``polar push-hub`` (against a stand-in for the Hub's HTTP API: the Hub cannot be reached here)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from polar_cli.builders import verify
from polar_cli.datasets.demo import TASKS
from polar_cli.generate import group_stats, open_ledger
from polar_cli.harnesses.testing import in_ci, missing_cli_reason
from polar_cli.models import Completion, Trace, Trajectory
from polar_cli.proxy.journal import read_journal
from polar_cli.registry import get_harness
from polar_cli.rewards import zero_variance_cell
from tests.generate.hub import FakeHub
from tests.support.readme import polar_commands, readme_block

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[list[str]]:
    """The ``polar`` commands of the README's offline-generation block, as written."""
    return polar_commands(readme_block("Offline generation", "bash"))


def polar(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def load(run: dict[str, Any], folder: Path, config: str) -> Any:
    """``datasets.load_dataset`` on an exported folder, offline, with a cache of this test's own (the default cache
    is shared, and keyed on the folder's name)."""
    import datasets

    return datasets.load_dataset(str(folder), config, cache_dir=str(run["cwd"] / "hf-cache"))


def results_in(ledger: Path) -> int:
    try:
        with sqlite3.connect(ledger) as db:
            return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Generate (killed after its first result, then resumed) and export, as the README says."""
    reason = missing_cli_reason(get_harness("pi"))
    if reason:
        pytest.fail(reason) if in_ci() else pytest.skip(reason)
    generate, export, push = readme_commands()
    assert generate[:2] == ["polar", "generate"] and export[:2] == ["polar", "export"]
    cwd = tmp_path_factory.mktemp("readme")
    out = cwd / generate[generate.index("--out") + 1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-m", "polar_cli", *generate[1:]], cwd=cwd, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while results_in(out / "ledger.db") < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, "polar generate ended before it could be killed"
    os.killpg(first.pid, signal.SIGKILL)  # the command and every session process it started
    first.wait()
    killed_with = results_in(out / "ledger.db")
    assert 1 <= killed_with < len(TASKS)
    second = polar(generate, cwd)
    assert second.returncode == 0, second.stdout + second.stderr
    exported = polar(export, cwd)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    return {"cwd": cwd, "out": out, "dataset": cwd / export[export.index("--to") + 1], "stdout": second.stdout,
            "push": push, "killed_with": killed_with}  # fmt: skip


def test_generate_resumes_after_sigkill_with_one_result_per_session(run: dict[str, Any]) -> None:
    with open_ledger(run["out"], must_exist=True) as ledger:
        rows = ledger.rows()
        attempts = ledger.db.execute("SELECT task_id, sample_index, attempt, status, error FROM attempts").fetchall()
    assert sorted((r.task_id, r.sample_index) for r in rows) == sorted((f"demo-{n}", 0) for n in TASKS)
    assert all(r.status == "completed" for r in rows), rows  # every task completes
    assert {r.task_id for r in rows if not r.accepted} == {"demo-count-lines"}  # its script answers wrongly
    assert all(status is not None for *_, status, _error in attempts)  # nothing left in flight
    # the service under rollouts/service ran each (task, sample) once more at most (the attempt killed mid-run)
    with sqlite3.connect(run["out"] / "service" / "server.db") as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "sessions" in tables
        sessions = db.execute("SELECT session_id, attempt, state FROM sessions").fetchall()
    # one service session per (task, sample): the re-run re-attached, never re-ran (on failure: the ledger's attempts
    # with their errors, and the service's sessions with their dispatch counts)
    assert len(sessions) == len(TASKS), (attempts, sessions)


def test_acceptance_table_matches_the_results(run: dict[str, Any]) -> None:
    with open_ledger(run["out"], must_exist=True) as ledger:
        stats = {s.group: s for s in group_stats(ledger.rows())}
    lines = [line for line in run["stdout"].splitlines() if "│" in line]
    for group, s in stats.items():
        cells = next(
            re.split(r"\s*│\s*", line.strip("│ ")) for line in lines if re.search(rf"│ {re.escape(group)} ", line)
        )
        assert cells[:6] == [group, str(s.tasks), str(s.sessions), str(s.attempts), str(s.accepted), f"{s.rate:.1%}"]
    assert stats["total"].sessions == len(TASKS) and stats["total"].accepted == len(TASKS) - 1
    assert stats["demo/calc"].accepted == 2 and stats["demo/files"].accepted == 1
    for title, first in (("rewards by repo", "total"), ("rewards by harness", "pi")):
        section = run["stdout"][run["stdout"].index(title):]
        cells = next(re.split(r"\s*│\s*", line.strip("│ ")) for line in section.splitlines()
                     if line.startswith(f"│ {first} "))  # fmt: skip
        total = stats["total"].rewards  # every task ran pi
        assert total.mean is not None and total.std is not None and total.pass_at_k
        assert cells[:7] == [first, str(stats["total"].tasks), str(total.sessions), str(total.rewarded),
                             f"{total.mean:.3f}", f"{total.std:.3f}", zero_variance_cell(total)], title  # fmt: skip
        assert cells[7] == f"{total.pass_at_k[1]:.3f}"


def _journal(run: dict[str, Any], session_id: str, traces: list[Trace]) -> list[Completion]:
    """The session's journaled completions of the attempt that produced its result (a session interrupted by the kill
    was run again under the same id, and its journal holds the lost attempt's calls first)."""
    completions = read_journal(run["out"] / "service" / "journal" / f"{session_id}.jsonl")
    first = min(i for t in traces for i in t.metadata["completion_indices"])
    return [c for c in completions if c.index >= first]


def test_exported_traces_load_offline_and_verify_against_the_journal(run: dict[str, Any]) -> None:
    traces = load(run, run["dataset"], "traces")
    by_session: dict[str, list[Trace]] = defaultdict(list)
    for split in traces.values():
        for row in split:
            by_session[row["session_id"]].append(Trace(
                prompt_ids=row["prompt_ids"], response_ids=row["response_ids"], loss_mask=row["loss_mask"],
                response_logprobs=[{"token_id": t, "logprob": lp}
                                   for t, lp in zip(row["response_ids"], row["response_logprobs"], strict=True)],
                policy_versions=row["policy_versions"], metadata=json.loads(row["metadata"])))  # fmt: skip
            assert row["harness"] == "pi" and row["task_id"].startswith("demo-") and row["chain_index"] == 0
    assert len(by_session) == len(TASKS)
    for session_id, session_traces in by_session.items():
        completions = _journal(run, session_id, session_traces)
        report = verify(Trajectory(status="completed", traces=session_traces), completions)
        assert report.ok, report.summary()
        assert report.placed_completions == len(completions) >= 2


def test_exported_messages_hold_the_tool_calls_pi_made(run: dict[str, Any]) -> None:
    messages = load(run, run["dataset"], "messages")
    rows = [row for split in messages.values() for row in split]
    assert len(rows) == len(TASKS)
    for row in rows:
        name = json.loads(row["metadata"])["instance_id"]
        script_calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                        for turn in TASKS[name][4][0] for c in turn.get("tool_calls", [])]  # fmt: skip
        made = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for m in row["messages"] if m["role"] == "assistant" for c in m["tool_calls"] or []]  # fmt: skip
        assert made == script_calls
        call_ids = [c["id"] for m in row["messages"] if m["role"] == "assistant" for c in m["tool_calls"] or []]
        answered = [m["tool_call_id"] for m in row["messages"] if m["role"] == "tool"]
        assert answered == call_ids  # pi ran each call and sent its result back
        assert {t["function"]["name"] for t in json.loads(row["tools"])} >= {"bash", "read", "edit", "write"}
        assert json.loads(row["metadata"])["repo"].startswith("demo/")


def test_split_keeps_groups_of_two_in_both_and_is_deterministic(run: dict[str, Any]) -> None:
    traces = load(run, run["dataset"], "traces")
    groups = {split: {row["group"] for row in rows} for split, rows in traces.items()}
    # demo/calc and demo/files have two tasks each, demo/strings one
    assert {"demo/calc", "demo/files"} <= groups["train"] & groups["test"]
    assert "demo/strings" in groups["train"] and "demo/strings" not in groups["test"]
    again = polar(["polar", "export", "rollouts", "--to", "again", "--test-size", "0.2", "--stratify-by", "repo",
                   "--seed", "0"], run["cwd"])  # fmt: skip
    assert again.returncode == 0, again.stderr
    twice = load(run, run["cwd"] / "again", "traces")
    assert {s: sorted(twice[s]["session_id"]) for s in twice} == {s: sorted(traces[s]["session_id"]) for s in traces}


def test_export_of_binary_token_columns_matches_the_json_path_on_a_real_folder(run: dict[str, Any]) -> None:
    """The generated folder's results carry their tokens as arrays (``result_tokens``); the same folder without them
    (as written before that table existed) exports through the JSON path: both give the very same rows."""
    import shutil

    import pyarrow.parquet as pq

    from polar_cli.export import ExportOptions, export

    copy = run["cwd"] / "as-before"
    shutil.copytree(run["out"], copy)
    with sqlite3.connect(copy / "ledger.db") as db:
        assert db.execute("SELECT COUNT(*) FROM result_tokens").fetchone()[0] == results_in(copy / "ledger.db") > 0
        db.execute("DROP TABLE result_tokens")
    options = ExportOptions(test_size=0.2, stratify_by="repo")
    new, old = export(run["out"], run["cwd"] / "cmp-new", options), export(copy, run["cwd"] / "cmp-old", options)
    assert new.rows == old.rows
    for config in ("traces", "messages"):
        tables = [[pq.read_table(f).to_pylist() for f in sorted((x.out / config).glob("*"))] for x in (new, old)]
        assert tables[0] == tables[1] and any(tables[0])


def test_push_hub_uploads_the_folder_and_says_why_it_cannot(run: dict[str, Any]) -> None:
    push = run["push"]
    with FakeHub() as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": hub.token, "HF_HUB_DISABLE_TELEMETRY": "1"}
        done = polar(push, run["cwd"], env)
        assert done.returncode == 0, done.stderr
        repo = push[3]
        assert done.stdout.strip() == f"{hub.url}/datasets/{repo}"
        body = hub.repos[repo]
        assert body["type"] == "dataset" and (body.get("private") is True or body.get("visibility") == "private")
        local = {str(p.relative_to(run["dataset"])) for p in run["dataset"].rglob("*") if p.is_file()}
        assert set(hub.files[repo]) == local
        assert hub.files[repo]["README.md"] == (run["dataset"] / "README.md").read_bytes()
        again = polar(push, run["cwd"], env)
        *steps, error = again.stderr.strip().splitlines()  # the steps that ran (stderr is no terminal), the error
        assert steps == [f"polar push-hub: creating dataset repo {repo} at {hub.url}"]
        assert again.returncode == 2  # docs/cli.md: an output that exists
        assert error == f"Error: dataset repo {repo} already exists (--exist-ok uploads into it)"
    offline = polar(push, run["cwd"], {"HF_HUB_OFFLINE": "1", "HF_TOKEN": "x"})
    assert offline.returncode == 3 and len(offline.stderr.strip().splitlines()) == 1 and "offline" in offline.stderr
    no_token = polar([*push, "--exist-ok"], run["cwd"], {"HF_TOKEN": "", "HF_HOME": str(run["cwd"] / "hf-home")})
    assert no_token.returncode == 3 and no_token.stderr.strip().startswith("Error: no HuggingFace token")
