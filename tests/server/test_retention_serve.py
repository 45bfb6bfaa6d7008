"""Retention on real ``polar serve`` processes (the shell harness, the scripted backend): a run past its size cap
keeps every running or unacknowledged task and removes the oldest acknowledged ones, a restart still answers for every
task (410 for the removed), ``polar status`` shows the disk and what retention removed; age-based compaction keeps the
summaries; bad settings are one line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.client import PolarClient
from polar_cli.errors import RemovedError, TaskNotEndedError
from polar_cli.models import ServiceStatus, TaskStatus
from polar_cli.online import store_tasks
from polar_cli.rewards import trainable_tokens
from polar_cli.server.config import DB_NAME
from polar_cli.server.disk import SessionFiles, measure
from polar_cli.server.retention import format_size
from polar_cli.server.store import SQLiteStore
from tests.server.procs import REPO, Serve, client, serve_config, until_true, waiting_task

ACKED = ["r0", "r1", "r2", "r3"]
UNACKED = ["r4", "r5"]


def files_of(data_dir: Path) -> SessionFiles:
    return SessionFiles(data_dir / "results", data_dir / "journal")


def result_and_journal(data_dir: Path, session_ids: list[str]) -> list[Path]:
    return [path for session_id in session_ids for path in files_of(data_dir).paths(session_id)[:2]]


async def status_of(http: httpx.AsyncClient) -> ServiceStatus:
    return ServiceStatus.model_validate((await http.get("/rollout/status")).json())


async def run_tasks(info: dict[str, Any], task_ids: list[str]) -> None:
    async with client(info) as http:
        for task_id in task_ids:
            assert (await http.post("/rollout/task/submit", json=waiting_task(task_id, 1))).status_code == 200
        for task_id in task_ids:
            answer = await http.get(f"/rollout/task/{task_id}", params={"wait": 120})
            assert TaskStatus.model_validate(answer.json()).state == "completed", answer.text[:2000]


def sizes(data_dir: Path, task_ids: list[str]) -> tuple[int, dict[str, int], dict[str, list[str]]]:
    """What the stopped server kept (``kept_bytes``), each task's part of it, and its sessions."""
    store = SQLiteStore(data_dir / DB_NAME)
    try:
        files = files_of(data_dir)
        kept = measure(data_dir / DB_NAME, store.db_bytes(), files).kept_bytes
        each, sessions = {}, {}
        for task_id in task_ids:
            db_bytes, sessions[task_id] = store.task_data(task_id)
            each[task_id] = db_bytes + files.size(sessions[task_id])
    finally:
        store.close()
    return kept, each, sessions


def test_a_size_cap_removes_the_oldest_acknowledged_tasks_and_a_restart_answers_for_all(tmp_path: Path) -> None:
    data_dir = tmp_path / "polar-data"
    marker = tmp_path / "never"  # the held task's agent waits for it: the task runs throughout
    config = serve_config(tmp_path, "serve", server={"retention": {"interval_s": 0.3}})
    first = Serve(data_dir, "--port", "0", "--config", str(config))

    async def before() -> None:
        info = await first.ready()
        await run_tasks(info, ACKED + UNACKED)
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("held", 1, marker))
            refused = await http.post("/rollout/task/held/ack")
            assert refused.status_code == 409 and "'held' is" in refused.json()["error"]["message"]
            assert (await http.post("/rollout/task/nope/ack")).status_code == 404
            with PolarClient(info["url"], info["token"]) as polar, pytest.raises(TaskNotEndedError, match="'held' is"):
                polar.ack("held")
            for task_id in ACKED:  # one after the other: r0 is the oldest acknowledgement
                assert (await http.post(f"/rollout/task/{task_id}/ack")).json()["task_id"] == task_id

            async def measured() -> bool:
                disk = (await status_of(http)).disk
                return disk is not None and disk.journal_bytes > 0 and disk.results_bytes > 0 and disk.data_bytes > 0

            await until_true(measured, "the data dir measured", within=30)

    try:
        asyncio.run(before())
    finally:
        first.stop()
    kept, each, sessions = sizes(data_dir, ACKED + UNACKED)
    for task_id in ACKED + UNACKED:
        assert all(path.exists() for path in result_and_journal(data_dir, sessions[task_id])), task_id
    cap = kept - each["r0"] - each["r1"] // 2  # r0 alone is not enough: r0 and r1 must go, and only they
    args = ("--port", "0", "--config", str(config), "--retention-max-bytes", str(cap))
    second = Serve(data_dir, *args)

    async def capped() -> None:
        info = await second.ready()
        async with client(info) as http:
            status = await status_of(http)  # the pass at start ran before the server answered
            assert status.retention is not None and status.retention.removed_tasks == 2, status.retention
            assert status.retention.settings == f"remove acknowledged tasks over {format_size(cap)}"
            assert status.retention.freed_bytes == each["r0"] + each["r1"] and status.retention.note is None
            assert status.disk is not None and status.disk.kept_bytes == kept - each["r0"] - each["r1"] <= cap
            await check_answers(http, removed=["r0", "r1"], kept=["r2", "r3", *UNACKED])
            running = TaskStatus.model_validate((await http.get("/rollout/task/held")).json())
            assert running.state in ("pending", "running") and running.acked_at is None
            shown = subprocess.run([sys.executable, "-m", "polar_cli", "status", "--server", info["url"], "--token",
                                    info["token"]], capture_output=True, text=True, timeout=60,
                                   env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            for said in ("disk (the server's data dir)", "journals", "removed by retention", "2 tasks",
                         f"remove acknowledged tasks over {format_size(cap)}"):  # fmt: skip
                assert said in shown.stdout, shown.stdout
            last = status.retention.last_run_at
            await until_true(lambda: later_pass(http, last), "another retention pass", within=30)
            assert (await status_of(http)).retention.removed_tasks == 2  # type: ignore[union-attr]
        removed = result_and_journal(data_dir, sessions["r0"] + sessions["r1"])
        assert removed and not any(path.exists() for path in removed)
        for task_id in ["r2", "r3", *UNACKED]:
            assert all(path.exists() for path in result_and_journal(data_dir, sessions[task_id])), task_id

    try:
        asyncio.run(capped())
    finally:
        second.kill9()  # a crash: what retention did was committed
        second.stop()
    third = Serve(data_dir, *args)

    async def restarted() -> None:
        info = await third.ready()
        async with client(info) as http:
            await check_answers(http, removed=["r0", "r1"], kept=["r2", "r3", *UNACKED])
            assert (await http.get("/rollout/task/held")).status_code == 200
            retention = (await status_of(http)).retention
            assert retention is not None and retention.removed_tasks == 2
            again = await http.post("/rollout/task/submit", json=waiting_task("r0", 1))
            assert again.status_code == 410 and "removed by retention" in again.json()["error"]["message"]
            ended = (await http.get("/rollout/tasks", params={"since": 0})).json()["task_ids"]
            assert set(ended) == {"r2", "r3", *UNACKED}
        exported = {task.request.task_id for task in store_tasks(data_dir)}  # polar export DATA_DIR reads these
        assert exported == {"r2", "r3", *UNACKED, "held"}
        with PolarClient(info["url"], info["token"]) as polar:
            with pytest.raises(RemovedError, match="task 'r1' was removed by retention"):
                polar.status("r1")
            assert polar.ack("r4").task_id == "r4" and polar.status("r4").acked_at is not None

    try:
        asyncio.run(restarted())
    finally:
        marker.touch()
        third.stop()


async def later_pass(http: httpx.AsyncClient, last: float | None) -> bool:
    retention = (await status_of(http)).retention
    return retention is not None and (retention.last_run_at or 0) > (last or 0)


async def check_answers(http: httpx.AsyncClient, *, removed: list[str], kept: list[str]) -> None:
    for task_id in removed:
        for route in (f"/rollout/task/{task_id}", f"/rollout/task/{task_id}/request"):
            answer = await http.get(route)
            assert answer.status_code == 410, (route, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "gone" and f"task '{task_id}' was removed by retention at " in error["message"]
    for task_id in kept:
        status = TaskStatus.model_validate((await http.get(f"/rollout/task/{task_id}")).json())
        assert status.state == "completed" and status.retention is None, task_id
        assert [len(r.trajectory.traces) > 0 for r in status.results] == [True], task_id  # all of it kept


def test_age_based_compaction_keeps_summaries_of_acknowledged_tasks_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "polar-data"
    config = serve_config(tmp_path, "serve", server={"retention": {"max_age": 1, "mode": "compact",
                                                                   "interval_s": 0.2}})  # fmt: skip
    serve = Serve(data_dir, "--port", "0", "--config", str(config))

    async def body() -> None:
        info = await serve.ready()
        await run_tasks(info, ["old", "kept"])
        async with client(info) as http:
            full = TaskStatus.model_validate((await http.get("/rollout/task/old")).json())
            assert (await http.post("/rollout/task/old/ack")).status_code == 200

            async def compacted() -> bool:
                return TaskStatus.model_validate((await http.get("/rollout/task/old")).json()).retention is not None

            await until_true(compacted, "the acknowledged task compacted", within=30)
            old = TaskStatus.model_validate((await http.get("/rollout/task/old")).json())
            assert old.retention == "compacted" and old.completed == 1 and old.rewards == full.rewards
            (was,), (now,) = full.results, old.results
            assert was.trajectory.traces and not now.trajectory.traces
            summary = {"trajectory", "metadata"}
            assert now.model_dump(exclude=summary) == was.model_dump(exclude=summary)
            held = {"traces": len(was.trajectory.traces), "trainable_tokens": trainable_tokens(was)}
            assert now.metadata == {**was.metadata, "polar_compacted": held} and held["trainable_tokens"] > 0
            assert not any(path.exists() for path in files_of(data_dir).paths(was.session_id))
            kept = TaskStatus.model_validate((await http.get("/rollout/task/kept")).json())
            assert kept.retention is None and kept.results[0].trajectory.traces  # not acknowledged: untouched
            assert files_of(data_dir).paths(kept.results[0].session_id)[1].exists()
            retention = (await status_of(http)).retention
            assert retention is not None and (retention.compacted_tasks, retention.removed_tasks) == (1, 0)
            assert retention.settings == "compact acknowledged tasks after 1s"
            assert [task.request.task_id for task in store_tasks(data_dir)] == ["kept"]  # no traces: no export

    try:
        asyncio.run(body())
    finally:
        serve.stop()


def test_bad_retention_settings_are_one_line_naming_the_field(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bad = tmp_path / "serve.yaml"
    bad.write_text("server:\n  retention:\n    max_age: 7 days\n")
    for args, said in [
        (["serve", "--retention-max-bytes", "50 gigs"],
         "polar serve: invalid ServeConfig: server.retention.max_bytes: '50 gigs' is not a size"),
        (["serve", "--retention-mode", "delete"],
         "server.retention.mode: Input should be 'remove' or 'compact'"),
        (["serve", "--config", str(bad)],
         f"{bad}: invalid ServeConfig: server.retention.max_age: '7 days' is not a duration"),
        (["generate", "--dataset", "demo", "--retention-max-age", "0"],
         "polar generate --retention-*: invalid RetentionConfig: max_age: '0' is not a duration"),
        (["generate", "--dataset", "demo", "--server", "http://127.0.0.1:9", "--retention-max-age", "1d"],
         "--retention-* set the embedded service's retention: with --server, give them to that polar serve"),
    ]:  # fmt: skip
        run = subprocess.run([sys.executable, "-m", "polar_cli", *args, "--out" if args[0] == "generate" else
                              "--data-dir", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=60)  # fmt: skip
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and said in lines[0], lines
    assert not (tmp_path / "out").exists()  # refused before anything was created
