"""Online data out of a real ``polar serve`` (scripted backend, loopback): ``polar export``, ``polar view`` and
``polar verify`` read its data dir, tasks on the running server (``--server URL --task ID``) and a ``polar status
TASK --json`` file, the same way they read a ``polar generate`` folder."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.client import AsyncPolarClient, PolarClient
from polar_cli.commands.view import default_out
from polar_cli.errors import PolarError
from polar_cli.inputs import ServerTasks, parse_since
from polar_cli.models import TaskRequest
from polar_cli.online import read_only, store_tasks
from tests.client.conftest import TOKEN, start_serve, stop
from tests.gateway.test_node import task
from tests.view.browser import need_browser, opened

FIRST, SECOND, CANCELLED = "online-a", "online-b", "online-cancelled"
WIDE = {"COLUMNS": "200"}


@dataclass(frozen=True)
class Online:
    url: str
    data_dir: Path
    root: Path

    @property
    def server(self) -> list[str]:
        return ["--server", self.url, "--token", TOKEN]


@pytest.fixture(scope="module")
def online(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Online]:
    """One ``polar serve`` that ran two tasks of two samples each: the first completes (policy_version 7 in its
    metadata), the second's sessions crash after one model call (status error, one trace each); and a third task,
    cancelled."""
    root = tmp_path_factory.mktemp("online")
    proc, url = start_serve(root / "data", root / "serve.log")
    try:
        first = task(FIRST, {}, num_samples=2)
        first.metadata["policy_version"] = 7
        second = task(SECOND, {"CALLS": "1", "CRASH": "boom"}, num_samples=2)
        with PolarClient(url, TOKEN) as client:
            for t in (first, second):
                client.submit(t)
            for t in (first, second):
                assert client.wait(t.task_id, timeout=120).state in ("completed", "failed")
            client.submit(task(CANCELLED, {"HANG": "1"}))
            assert client.cancel(CANCELLED).state == "cancelled"
        yield Online(url, root / "data", root)
    finally:
        stop(proc)


def polar(*args: str) -> Any:
    result = CliRunner().invoke(build_app(), list(args), env=WIDE)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def load(folder: Path, config: str, cache: Path) -> list[dict[str, Any]]:
    import datasets

    rows: list[dict[str, Any]] = datasets.load_dataset(str(folder), config, cache_dir=str(cache))["train"].to_list()
    return rows


def test_export_from_the_server_the_data_dir_and_a_status_file(online: Online, tmp_path: Path) -> None:
    by_task = polar("export", *online.server, "--task", SECOND, "--task", FIRST, "--to", str(tmp_path / "remote"))
    assert by_task.exit_code == 0, by_task.output
    from_dir = polar("export", str(online.data_dir), "--to", str(tmp_path / "local"))
    assert from_dir.exit_code == 0, from_dir.output
    cache = tmp_path / "hf-cache"
    for config in ("traces", "messages"):
        remote = load(tmp_path / "remote", config, cache)
        local = [r for r in load(tmp_path / "local", config, cache) if r["task_id"] in (FIRST, SECOND)]
        assert remote == local and remote
    traces = load(tmp_path / "remote", "traces", cache)
    # a task is a group of num_samples samples; tasks in the order they were submitted, whatever --task's order
    assert [(r["task_id"], r["group"], r["sample_index"]) for r in traces if r["chain_index"] == 0] == [
        (FIRST, FIRST, 0), (FIRST, FIRST, 1), (SECOND, SECOND, 0), (SECOND, SECOND, 1)]  # fmt: skip
    first = [r for r in traces if r["task_id"] == FIRST]
    assert {r["status"] for r in first} == {"completed"} and all(r["accepted"] for r in first)
    assert {r["policy_version"] for r in first} == {"7"} and {r["harness"] for r in first} == {"shell"}
    assert all(r["trainable"] and r["role"] == "main" and r["policy_versions"] is not None for r in first)
    assert all(1 in r["loss_mask"] and len(r["response_logprobs"]) == len(r["response_ids"]) for r in first)
    crashed = [r for r in traces if r["task_id"] == SECOND]
    assert {r["status"] for r in crashed} == {"error"} and not any(r["accepted"] for r in crashed)
    cancelled = [r for r in load(tmp_path / "local", "messages", cache) if r["task_id"] == CANCELLED]
    assert [(r["status"], r["messages"]) for r in cancelled] == [("cancelled", [])]  # a session, though it never ran

    status = polar("status", FIRST, *online.server, "--json")
    assert status.exit_code == 0, status.output
    (tmp_path / "first.json").write_text(status.stdout)
    from_file = polar("export", str(tmp_path / "first.json"), "--to", str(tmp_path / "from-status"))
    assert from_file.exit_code == 0, from_file.output
    rows = load(tmp_path / "from-status", "traces", cache)
    tokens = ("session_id", "sample_index", "group", "status", "prompt_ids", "response_ids", "loss_mask",
              "response_logprobs", "policy_versions", "role", "trainable", "harness", "policy_version")  # fmt: skip
    assert [{k: r[k] for k in tokens} for r in rows] == [{k: r[k] for k in tokens} for r in first]
    messages = load(tmp_path / "from-status", "messages", cache)
    remote_messages = [r for r in load(tmp_path / "remote", "messages", cache) if r["task_id"] == FIRST]
    assert [(json.loads(r["metadata"]), r["messages"]) for r in messages] == [
        (json.loads(r["metadata"]), r["messages"]) for r in remote_messages]  # fmt: skip


def test_export_reads_the_data_dir_in_place_and_writes_what_a_temporary_ledger_would(
    online: Online, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``polar export`` of a data dir copies no result into a temporary ledger (a ``Ledger`` made while it runs
    fails the test), and its folder is the one the ledger's way writes: the same files, tables and card."""
    import pyarrow.parquet as pq

    from polar_cli import online as online_data
    from polar_cli.export import ExportOptions, export, exporter

    options = ExportOptions(test_size=0.5, stratify_by="task_id", keep_rejected=True)
    with monkeypatch.context() as patch:
        patch.setattr(exporter, "export_source", online_data.online_ledger)
        export(online.data_dir, tmp_path / "via-ledger", options)

    def no_ledger(*args: object, **kwargs: object) -> None:
        raise AssertionError("a temporary ledger was made")

    monkeypatch.setattr(online_data, "Ledger", no_ledger)
    report = export(online.data_dir, tmp_path / "in-place", options)
    assert report.rows["traces"]["train"] and report.rows["messages"]["test"]
    files = sorted(p.relative_to(tmp_path / "in-place") for p in (tmp_path / "in-place").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "via-ledger") for p in (tmp_path / "via-ledger").rglob("*")
                           if p.is_file())  # fmt: skip
    for name in files:
        here, there = tmp_path / "in-place" / name, tmp_path / "via-ledger" / name
        if name.suffix == ".parquet":
            assert pq.read_table(here).equals(pq.read_table(there)), name
        else:
            assert here.read_text() == there.read_text(), name


def test_export_of_tasks_that_ended_since_a_time(online: Online, tmp_path: Path) -> None:
    since = polar("export", *online.server, "--since", "1d", "--to", str(tmp_path / "since"))
    assert since.exit_code == 0, since.output
    sessions = {r["task_id"] for r in load(tmp_path / "since", "messages", tmp_path / "hf-cache")}
    assert {FIRST, SECOND} <= sessions
    with pytest.raises(PolarError, match="ended since"):
        polar("export", *online.server, "--since", "2999-01-01T00:00", "--to", str(tmp_path / "none"))


def test_view_of_the_data_dir_opens_in_chromium(online: Online, tmp_path: Path) -> None:
    need_browser()
    page = tmp_path / "online.html"
    viewed = polar("view", str(online.data_dir), "--out", str(page))
    assert viewed.exit_code == 0, viewed.output
    with opened(page) as (browser_page, errors):
        ids = browser_page.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)")
        assert {i.rsplit("-", 1)[0] for i in ids} >= {f"{t}-{n}" for t in (FIRST, SECOND) for n in (0, 1)}
        assert browser_page.inner_text("header.top .src").startswith(f"serve: {online.data_dir}")
        browser_page.locator(f'[data-session-id^="{FIRST}-0-"]').click()
        browser_page.wait_for_selector("html[data-ready=session]", state="attached")
        assert browser_page.locator('#session .rtoks [data-mask="1"]').count() > 0
        assert errors == []


def test_verify_of_the_data_dir_passes_and_fails_on_a_tampered_journal_or_result(online: Online,
                                                                                 tmp_path: Path) -> None:  # fmt: skip
    ok = polar("verify", str(online.data_dir))
    assert ok.exit_code == 0, ok.output
    assert "0 violation(s)" in ok.stdout and ok.stdout.strip().endswith("ok")

    session = sorted(online.data_dir.glob(f"journal/{FIRST}*.jsonl"))[0].stem
    journal = tmp_path / "journal"
    shutil.copytree(online.data_dir / "journal", journal)
    lines = (journal / f"{session}.jsonl").read_bytes().splitlines()
    record = orjson.loads(lines[0])
    record["response_ids"][0] += 1
    (journal / f"{session}.jsonl").write_bytes(b"\n".join([orjson.dumps(record), *lines[1:]]) + b"\n")
    tampered = polar("verify", str(online.data_dir), "--journal", str(journal))
    assert tampered.exit_code == 1, tampered.output
    assert f"session {session} trace 0" in tampered.stdout and "FAILED" in tampered.stdout

    copy = tmp_path / "data"
    copy.mkdir()
    with sqlite3.connect(online.data_dir / "server.db") as source, sqlite3.connect(copy / "server.db") as target:
        source.backup(target)
    shutil.copytree(online.data_dir / "journal", copy / "journal")
    with sqlite3.connect(copy / "server.db") as db:
        result = json.loads(db.execute("SELECT result FROM sessions WHERE session_id = ?", (session,)).fetchone()[0])
        trace = result["trajectory"]["traces"][0]
        sampled = trace["loss_mask"].index(1)
        trace["response_ids"][sampled] += 1  # a sampled token swapped, its logprob entry kept aligned
        trace["response_logprobs"][sampled]["token_id"] += 1
        db.execute("UPDATE sessions SET result = ? WHERE session_id = ?", (json.dumps(result), session))
    stored = polar("verify", str(copy))
    assert stored.exit_code == 1, stored.output
    assert f"session {session} trace 0" in stored.stdout and "FAILED" in stored.stdout
    with sqlite3.connect(copy / "server.db") as db:  # torn apart: the result itself names the session
        trace["response_ids"][sampled] += 1
        db.execute("UPDATE sessions SET result = ? WHERE session_id = ?", (json.dumps(result), session))
    with pytest.raises(PolarError, match=f"session {session} of task {FIRST}: not a valid SessionResult"):
        polar("verify", str(copy))


def test_clear_one_line_errors(online: Online, tmp_path: Path) -> None:
    (tmp_path / "neither").mkdir()
    cases = {
        ("export", str(tmp_path / "neither"), "--to", str(tmp_path / "x")): "none of a polar generate folder",
        ("view", "--task", FIRST): "--task reads tasks on a running polar serve: give its URL with --server",
        ("verify", "--server", online.url): "--server needs the tasks to read",
        ("export", str(online.data_dir), *online.server, "--task", FIRST, "--to", str(tmp_path / "y")): "not both",
        ("view", "--server", online.url, "--token", TOKEN, "--task", "no-such-task"): "unknown task 'no-such-task'",
        ("view", "--server", online.url, "--token", "wrong", "--task", FIRST): "HTTP 401",
        ("export", "--server", online.url, "--since", "yesterday", "--to", str(tmp_path / "z")): "--since 'yesterday'",
    }
    env = {k: v for k, v in os.environ.items() if k not in ("POLAR_SERVER", "POLAR_TOKEN")}
    for args, expected in cases.items():
        with pytest.MonkeyPatch.context() as patch:
            for name in set(os.environ) - set(env):
                patch.delenv(name)
            with pytest.raises(PolarError) as caught:
                polar(*args)
        assert expected in str(caught.value) and "\n" not in str(caught.value), (args, str(caught.value))
    # the whole way, as a user sees it: one line on stderr, exit 2 (a 4xx: docs/cli.md), no traceback
    run = subprocess.run([sys.executable, "-m", "polar_cli", "export", "--server", online.url, "--token", TOKEN,
                          "--task", "no-such-task", "--to", str(tmp_path / "w")],
                         capture_output=True, text=True, env={**env, "POLAR_LOAD_PLUGINS": ""})  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("Error: unknown task 'no-such-task' (HTTP 404")


def test_both_clients_read_a_task_as_submitted_and_the_tasks_ended_since(online: Online) -> None:
    async def read() -> tuple[TaskRequest, list[str]]:
        async with AsyncPolarClient(online.url, TOKEN) as client:
            return await client.task_request(FIRST), await client.ended_tasks(0)

    with PolarClient(online.url, TOKEN) as client:
        request, ended = client.task_request(FIRST), client.ended_tasks()
        assert client.ended_tasks(time.time() + 3600) == []
    assert (request, ended) == asyncio.run(read())
    assert request.metadata["policy_version"] == 7 and request.num_samples == 2
    assert ended[:3] == [FIRST, SECOND, CANCELLED]


def test_since_accepts_epoch_seconds_iso_times_and_durations() -> None:
    assert parse_since("1700000000") == 1700000000.0
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("2026-01-31T12:00:00+00:00") == 1769860800.0
    assert str(ServerTasks("http://h:1", None, ("a", "b"))) == "http://h:1 (a, b)"
    assert default_out(ServerTasks("http://h:1", None, ("run/7", "b"))) == Path("run_7.html")
    assert default_out(ServerTasks("http://h:1", None, (), since=0.0)) == Path("tasks.html")


def test_reading_the_data_dir_neither_blocks_nor_changes_the_running_server(online: Online) -> None:
    """A reader's connection holding a snapshot open while the server runs a new task to its end: the task
    finishes (the reader blocks no write), the reader still sees its snapshot, and the database stays the server's
    (WAL, intact, nothing of the reader's in the data dir)."""
    before = sorted(p.name for p in online.data_dir.iterdir())
    reader = read_only(online.data_dir / "server.db")
    reader.execute("BEGIN")
    held = reader.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
    with PolarClient(online.url, TOKEN) as client:
        client.submit(task("online-c", {}, num_samples=1))
        assert client.wait("online-c", timeout=120).state == "completed"
    assert reader.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == held
    reader.execute("COMMIT")
    reader.close()
    assert [t.request.task_id for t in store_tasks(online.data_dir)][-1] == "online-c"
    with sqlite3.connect(f"{(online.data_dir / 'server.db').as_uri()}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert {p.name for p in online.data_dir.iterdir()} - set(before) <= {"results", "journal"}
