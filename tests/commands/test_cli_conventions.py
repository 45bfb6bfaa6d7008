"""The CLI conventions of docs/cli.md, run as real processes: an output is never replaced without --overwrite, a
task file's unknown names and config keys fail when it is read (file, field, did-you-mean) with exit 2, and a bad
POLAR_LOAD_PLUGINS fails naming the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_TASK = ROOT / "examples" / "shell-agent.yaml"
SCRIPT = ROOT / "examples" / "scripts" / "two-turns.yaml"


def polar(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "POLAR_LOAD_PLUGINS": "", **(env or {})}
    full.pop("POLAR_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_run_and_view_refuse_an_existing_output_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    out.write_text("earlier results\n")
    run = ["run", str(SHELL_TASK), "--script", str(SCRIPT), "--data-dir", str(tmp_path / "data"), "--out", str(out)]
    refused = polar(*run, cwd=tmp_path)
    assert refused.returncode == 2
    assert error_line(refused) == f"Error: --out {out} exists: pass --overwrite to replace it"
    assert out.read_text() == "earlier results\n" and not (tmp_path / "data").exists()  # refused before any work
    replaced = polar(*run, "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert '"status":"completed"' in out.read_text()

    page = tmp_path / "page.html"
    assert polar("view", str(out), "--out", str(page), cwd=tmp_path).returncode == 0
    page.write_text("mine")
    again = polar("view", str(out), "--out", str(page), cwd=tmp_path)
    assert again.returncode == 2 and "--overwrite" in error_line(again) and page.read_text() == "mine"
    default = polar("view", str(out), cwd=tmp_path)  # ./results.html
    assert default.returncode == 0 and (tmp_path / "results.html").is_file()
    assert polar("view", str(out), cwd=tmp_path).returncode == 2
    assert polar("view", str(out), "--out", str(page), "--overwrite", cwd=tmp_path).returncode == 0
    assert page.read_text() != "mine"

    script = tmp_path / "replay.yaml"  # polar replay --out: the same convention
    session = "--session=" + json.loads(out.read_text().splitlines()[0])["session_id"]
    journal = ["--journal", str(tmp_path / "data" / "journal")]
    assert polar("replay", str(out), session, *journal, "--out", str(script), cwd=tmp_path).returncode == 0
    script.write_text("mine")
    kept = polar("replay", str(out), session, *journal, "--out", str(script), cwd=tmp_path)
    assert kept.returncode == 2 and "--overwrite" in error_line(kept) and script.read_text() == "mine"
    replayed = polar("replay", str(out), session, *journal, "--out", str(script), "--overwrite", cwd=tmp_path)
    assert replayed.returncode == 0 and script.read_text().startswith("# polar replay")


def test_a_task_files_unknown_names_and_keys_fail_when_read_with_file_field_and_suggestion(tmp_path: Path) -> None:
    base = "task_id: t1\ninstruction: hi\nagent: {harness: shell, config: {command: 'true'}}\n"
    cases = {
        "evaluator: {strategy: test_on_outptu}\n":
            "evaluator.strategy: unknown evaluator 'test_on_outptu' (did you mean 'test_on_output'?)",
        "runtime: {backend: Local}\n": "runtime.backend: unknown runtime 'Local' (did you mean 'local'?)",
        "evaluator: {strategy: test_on_output, config: {comand: 'true'}}\n":
            "evaluator.config: evaluator 'test_on_output': command: Field required; unknown field 'comand' "
            "(did you mean 'command'?)",
    }  # fmt: skip
    for extra, message in cases.items():
        path = tmp_path / "task.yaml"
        path.write_text(base + extra)
        done = polar("run", str(path), "--script", str(SCRIPT), "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert error_line(done).startswith(f"Error: {path}: task 't1': {message}"), done.stderr
        assert "gateway:" not in done.stderr and not (tmp_path / "data").exists()  # nothing started


def test_an_unknown_harness_flag_gets_a_suggestion_and_exits_2(tmp_path: Path) -> None:
    done = polar("run", "--harness", "Shell", "--instruction", "hi", "--script", str(SCRIPT), cwd=tmp_path)
    assert done.returncode == 2
    assert "agent.harness: unknown harness 'Shell' (did you mean 'shell'?)" in error_line(done)
    left_out = polar("run", "--harness", "claude-code", "--instruction", "hi", "--script", str(SCRIPT), cwd=tmp_path)
    assert left_out.returncode == 2
    assert "(installed plugin 'claude-code' is not loaded: add it to $POLAR_LOAD_PLUGINS)" in error_line(left_out)


def test_a_bad_polar_load_plugins_fails_naming_the_variable(tmp_path: Path) -> None:
    for value, suggestion in (("polar-codex", "codex"), ("codx", "codex"), ("polar_claude_code", "claude-code")):
        done = polar("plugins", cwd=tmp_path, env={"POLAR_LOAD_PLUGINS": f"{value},swebench"})
        assert done.returncode == 2
        line = error_line(done)
        assert line.startswith(f"Error: $POLAR_LOAD_PLUGINS names {value!r}, which no installed plugin is "
                               f"(did you mean {suggestion!r}?)"), line  # fmt: skip
        assert "entry-point names" in line and "installed: " in line and "codex" in line


def test_an_unknown_backend_fails_before_anything_starts_with_a_suggestion(tmp_path: Path) -> None:
    for command in (["run", str(SHELL_TASK), "--data-dir", str(tmp_path / "data")], ["proxy"],
                    ["serve", "--data-dir", str(tmp_path / "data")]):  # fmt: skip
        done = polar(*command, "--backend", "vlm", "--backend-url", "http://127.0.0.1:1", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert error_line(done).startswith("Error: unknown backend 'vlm' (did you mean 'vllm'?); available: ")
        assert "starting" not in done.stderr and not (tmp_path / "data").exists()
