"""``polar generate --server URL`` against a real ``polar serve``, with an ``hf`` dataset read from a local JSONL
file: a session whose model call fails (its script's one turn is a backend error) is retried ``--max-retries`` times,
and a session that completes is not."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from polar_cli.generate import open_ledger
from polar_cli.harnesses.testing import in_ci, missing_cli_reason
from polar_cli.registry import get_harness
from tests.server.procs import Serve

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]
GOOD = [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "bash", "arguments": json.dumps({"command": "echo done > out.txt"})}}]},
    {"role": "assistant", "content": "out.txt is written."}]  # fmt: skip
BAD = [{"error": {"status": 400, "message": "scripted failure"}}]


def test_generate_on_a_remote_service_retries_failed_sessions(tmp_path: Path) -> None:
    reason = missing_cli_reason(get_harness("pi"))
    if reason:
        pytest.fail(reason) if in_ci() else pytest.skip(reason)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in [{"name": "good", "script": json.dumps(GOOD)},
                                                             {"name": "bad", "script": json.dumps(BAD)}]))  # fmt: skip
    config = tmp_path / "hf.yaml"
    config.write_text(yaml.safe_dump({
        "path": str(rows), "task_id": "{{ name }}", "instruction": "Write out.txt.",
        "metadata_fields": {"script": "script"}, "json_fields": ["script"],
        "task": {"timeout_seconds": 120, "agent": {"harness": "pi"},
                 "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f out.txt"}}},
    }))  # fmt: skip
    serve = Serve(tmp_path / "serve", "--port", "0")
    try:
        info = asyncio.run(serve.ready())
        # each row's script (JSON text, parsed by json_fields) travels inline in metadata.script
        argv = [sys.executable, "-m", "polar_cli", "generate", "--dataset", "hf", "--dataset-config", str(config),
                "--harness", "pi", "--server", info["url"], "--token", info["token"], "--max-retries", "1",
                "--out", str(tmp_path / "out"), "--group-by", "task_id"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    finally:
        serve.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    with open_ledger(tmp_path / "out", must_exist=True) as ledger:
        results = {r.task_id: r for r in ledger.rows()}
        attempts = {t: n for t, n in ledger.db.execute("SELECT task_id, COUNT(*) FROM attempts GROUP BY task_id")}
    assert results["good"].status == "completed" and results["good"].accepted and attempts["good"] == 1
    assert results["bad"].status == "error" and results["bad"].attempts == 2 and attempts["bad"] == 2
    assert "failed sessions (1)" in done.stdout
