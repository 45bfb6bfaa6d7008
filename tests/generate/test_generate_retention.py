"""``polar generate`` with retention (the shell harness, the scripted backend, an ``hf`` dataset from a local JSONL):
each service task is acknowledged once the ledger holds its result, retention then removes the embedded service's
copy (its database results, journals and result files), and the ledger, which is the data, stays as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from polar_cli.generate import open_ledger
from polar_cli.server.store import SQLiteStore
from tests.gateway.test_node import SCRIPT, task

ROOT = Path(__file__).resolve().parents[2]


def test_retention_removes_the_service_copy_of_what_the_ledger_holds_and_never_the_ledger(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"name": name, "script": json.dumps(SCRIPT)}) + "\n" for name in ("a", "b")))
    config = tmp_path / "hf.yaml"
    agent = task("template", {}).agent.model_dump(mode="json")
    config.write_text(yaml.safe_dump({
        "path": str(rows), "task_id": "{{ name }}", "instruction": "Answer twice.",
        "metadata_fields": {"script": "script"}, "json_fields": ["script"],
        "task": {"timeout_seconds": 60, "agent": agent, "builder": {"strategy": "per_request"}},
    }))  # fmt: skip
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "polar_cli", "generate", "--dataset", "hf", "--dataset-config", str(config),
            "--out", str(out), "--group-by", "task_id", "--retention-max-bytes", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    with open_ledger(out, must_exist=True) as ledger:
        before = ledger.db.execute("SELECT * FROM results ORDER BY task_id").fetchall()
        tokens = ledger.db.execute("SELECT * FROM result_tokens ORDER BY task_id").fetchall()
    assert [r[0] for r in before] == ["a", "b"] and len(tokens) == 2
    service = out / "service"
    store = SQLiteStore(service / "server.db")
    try:
        acked = dict(store._db.execute("SELECT task_id, acked_at FROM tasks").fetchall())
        assert set(acked) == {"a.s0.a1", "b.s0.a1"} and all(acked.values())  # each acknowledged after the ledger
        assert store.retention_counts().removed_tasks == 0  # the pass at start found nothing yet
        sessions = [session.session_id for session in store.sessions(states=("finished",))]
    finally:
        store.close()
    assert sorted(p.stem for p in (service / "journal").glob("*.jsonl")) == sorted(sessions)
    # the same command again: nothing left to run; the pass at start removes the service's copy
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    with open_ledger(out, must_exist=True) as ledger:
        assert ledger.db.execute("SELECT * FROM results ORDER BY task_id").fetchall() == before
        assert ledger.db.execute("SELECT * FROM result_tokens ORDER BY task_id").fetchall() == tokens
    store = SQLiteStore(service / "server.db")
    try:
        assert store.retention_counts().removed_tasks == 2
        assert [r.session_id for r in store.sessions(states=("finished",))] == sessions  # the rows stay, results go
        assert all(store.result(session_id) is None for session_id in sessions)
    finally:
        store.close()
    assert not list((service / "journal").glob("*.jsonl")) and not list((service / "results").glob("*.json"))
