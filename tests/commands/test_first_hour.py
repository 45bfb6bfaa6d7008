"""What a new user meets in the first hour with ``polar run`` and ``polar generate``, run as real processes: a scripted
backend with no script, an unreachable or refusing backend, flag errors, output to a pipe, ``--json``, stopping with
SIGTERM or SIGINT (and resuming), and the exit code of a generation where nothing completed."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from polar_cli.harnesses.testing import in_ci, missing_cli_reason
from polar_cli.registry import get_harness

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "scripts" / "two-turns.yaml"
SHELL_TASK = ROOT / "examples" / "shell-agent.yaml"


def env() -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(ROOT), "POLAR_LOAD_PLUGINS": ""}
    out.pop("COLUMNS", None)  # as in a pipe: rich's width is whatever the command chooses
    out.pop("POLAR_DEBUG", None)
    return out


def polar(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def refusing_backend() -> Iterator[str]:
    """An OpenAI-compatible server that refuses every call with 401, as one with the wrong API key does."""

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"error": {"message": "invalid api key sk-wrong", "type": "auth"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_scripted_backend_without_a_script_is_an_error_before_any_session(tmp_path: Path) -> None:
    run = polar("run", "--harness", "codex", "--instruction", "Fix the failing test", "--data-dir",
                str(tmp_path / "data"), cwd=tmp_path)  # fmt: skip
    assert run.returncode == 2
    assert "no script" in run.stderr and "--script" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "data" / "results").exists()  # no session ran
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"task_id": "t", "instruction": "x",
                                                      "agent": {"harness": "shell"}}) + "\n")  # fmt: skip
    generate = polar("generate", "--dataset", "tasks_file", "-O", f"path={tmp_path / 'tasks.jsonl'}", "--out",
                     str(tmp_path / "out"), cwd=tmp_path)  # fmt: skip
    assert generate.returncode == 2 and "no script" in generate.stderr, generate.stderr


@pytest.mark.parametrize("command", ["run", "generate"])
def test_an_unreachable_backend_is_reported_at_once_with_its_url_and_cause(tmp_path: Path, command: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    if command == "run":
        args = ["run", str(SHELL_TASK), "--backend", "vllm", "--backend-url", url, "--data-dir", str(tmp_path / "d")]
    else:
        args = ["generate", "--dataset", "demo", "--backend", "vllm", "--backend-url", url, "--out", str(tmp_path)]
    started = time.monotonic()
    answer = polar(*args, cwd=tmp_path, timeout=60)
    assert answer.returncode != 0
    assert time.monotonic() - started < 30  # not ~40 s of retries first (a behaviour bound, not a benchmark)
    lines = [line for line in answer.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, answer.stderr
    assert url in lines[0] and "does not answer" in lines[0] and "Connect" in lines[0], lines[0]
    assert "Traceback" not in answer.stderr


def test_a_refusing_backend_is_reported_with_its_answer(tmp_path: Path, refusing_backend: str) -> None:
    answer = polar("run", str(SHELL_TASK), "--backend", "vllm", "--backend-url", refusing_backend, "--data-dir",
                   str(tmp_path / "d"), cwd=tmp_path, timeout=60)  # fmt: skip
    assert answer.returncode != 0
    error = next(line for line in answer.stderr.splitlines() if line.startswith("Error:"))
    assert refusing_backend in error and "HTTP 401" in error and "invalid api key" in error, error


def test_flag_errors_name_the_flag_and_flags_read_as_flags(tmp_path: Path) -> None:
    cases = [(["run", str(SHELL_TASK), "--samples", "0"], "--samples"),
             (["run", str(SHELL_TASK), "--timeout", "0"], "--timeout"),
             (["generate", "--dataset", "demo", "--out", "o", "--concurrency", "0"], "--concurrency")]  # fmt: skip
    for args, flag in cases:
        answer = polar(*args, cwd=tmp_path)
        assert answer.returncode == 2 and f"'{flag}'" in answer.stderr, answer.stderr
        assert str(SHELL_TASK) not in answer.stderr  # the flag is wrong, not the task file
    for command in ("run", "generate", "serve", "submit", "export", "plugins"):
        shown = polar(command, "--help", cwd=tmp_path).stdout
        assert "<bool>" not in shown, shown


def test_run_json_and_a_piped_table_are_whole(tmp_path: Path) -> None:
    answer = polar("run", str(SHELL_TASK), "--script", str(SCRIPT), "--samples", "2", "--data-dir",
                   str(tmp_path / "data"), "--json", cwd=tmp_path)  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    results = json.loads(answer.stdout)  # one JSON document, nothing else on stdout
    assert [r["status"] for r in results] == ["completed", "completed"]
    assert all(r["trajectory"]["traces"] for r in results)
    assert results[0]["session_id"] in answer.stderr  # the table went to stderr
    plain = polar("run", str(SHELL_TASK), "--script", str(SCRIPT), "--data-dir", str(tmp_path / "data"),
                  cwd=tmp_path)  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "…" not in plain.stdout and "completed" in plain.stdout and "trainable tokens" in plain.stdout
    assert "[transformers]" not in plain.stderr and "Token indices" not in plain.stderr


def test_generate_exits_non_zero_when_no_session_completed_and_json_says_why(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    failing = {"instruction": "x", "agent": {"harness": "shell", "config": {"command": "exit 3"}},
               "metadata": {"script": [], "repo": "r"}, "evaluator": {"strategy": "session_completion"}}  # fmt: skip
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", **failing}) + "\n" for i in range(2)))
    answer = polar("generate", "--dataset", "tasks_file", "-O", f"path={tasks}", "--out", str(tmp_path / "out"),
                   "--max-retries", "0", "--json", cwd=tmp_path)  # fmt: skip
    assert answer.returncode == 1, answer.stderr
    document = json.loads(answer.stdout)
    assert document["sessions"] == 2 and document["completed"] == 0 and len(document["failed"]) == 2
    assert document["groups"][-1]["group"] == "total"
    assert "no session completed" in answer.stderr


def ledger_rows(out: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(out / "ledger.db") as db:
        return [(row[0], row[1]) for row in db.execute("SELECT task_id, sample_index FROM results")]


def wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> str:
    """Read ``proc``'s stderr until a line holds ``text``."""
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"never printed {text!r}: {seen}")


STOP_S = 15.0
"""How long a signalled command may take to exit. What shows it stopped *because of* the signal is its exit code
(128 + the signal) and its note; the bound only says it did not wait for its sessions (which never end, or would take
longer), and is wide enough for a loaded 2-core machine."""


def stopped_within(proc: subprocess.Popen[str], signum: int, seconds: float) -> tuple[int, str]:
    sent = time.monotonic()
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    took = time.monotonic() - sent
    assert took < seconds, f"took {took:.1f}s to stop"
    return proc.returncode, err


@pytest.mark.harness
def test_sigterm_stops_generate_with_the_real_pi_cli_and_a_rerun_resumes(tmp_path: Path) -> None:
    reason = missing_cli_reason(get_harness("pi"))
    if reason:
        pytest.fail(reason) if in_ci() else pytest.skip(reason)
    out = tmp_path / "rollouts"
    args = ("generate", "--harness", "pi", "--dataset", "demo", "--backend", "scripted", "--out", str(out))
    proc = start(*args, cwd=tmp_path)
    wait_for(proc, "embedded service")
    time.sleep(1.5)  # pi sessions under way
    code, err = stopped_within(proc, signal.SIGTERM, STOP_S)
    assert code == 128 + signal.SIGTERM, err
    note = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(note) == 1 and "SIGTERM" in note[0] and str(out) in note[0] and "again to resume" in note[0], err
    assert "[transformers]" not in err
    kept = ledger_rows(out)
    again = polar(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    rows = ledger_rows(out)
    assert len(rows) == 5 and len(set(rows)) == 5  # exactly one result per (task, sample)
    assert set(kept) <= set(rows)


def test_sigint_and_sigterm_stop_run_with_a_note(tmp_path: Path) -> None:
    release = tmp_path / "never"
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"task_id": "waits", "instruction": "wait", "num_samples": 2, "metadata": {"script": []},
                                "agent": {"harness": "shell", "config": {"command": f"while [ ! -e {release} ]; do "
                                                                                    "sleep 0.1; done"}}}))  # fmt: skip
    for signum in (signal.SIGINT, signal.SIGTERM):
        out = tmp_path / f"results-{signum}.jsonl"
        proc = start("run", str(task), "--data-dir", str(tmp_path / "data"), "--out", str(out), cwd=tmp_path)
        wait_for(proc, "gateway:")
        time.sleep(1.0)
        code, err = stopped_within(proc, signum, STOP_S)
        assert code == 128 + signum, err
        note = [line for line in err.splitlines() if line.startswith("interrupted")]
        assert len(note) == 1 and signal.Signals(signum).name in note[0] and str(out) in note[0], err
        results = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(results) == 2 and {r["status"] for r in results} == {"cancelled"}  # kept, not lost


def test_listing_tables_keep_every_cell_whole_in_a_pipe(tmp_path: Path) -> None:
    for args in (["plugins"], ["harness", "list"]):
        answer = polar(*args, cwd=tmp_path)
        assert answer.returncode == 0, answer.stderr
        assert "…" not in answer.stdout and "..." not in answer.stdout, answer.stdout
