"""``polar status`` against a real ``polar serve``: sessions by stage, heartbeat ages, the pools and throughput in
``--json``; ``--watch`` refreshing, stopping on Ctrl-C with exit 0, and riding out a server that goes away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar_cli.client import PolarClient
from polar_cli.models import StatusReport
from tests.client.conftest import TOKEN, Served, start_serve, stop
from tests.server.procs import waiting_task

ENV = {**os.environ, "POLAR_LOAD_PLUGINS": "", "COLUMNS": "200"}


def polar_status(served: Served, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "polar_cli", "status", "--server", served.url, "--token", served.token, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=timeout)


def report(served: Served) -> StatusReport:
    run = polar_status(served, "--json")
    assert run.returncode == 0, run.stderr
    return StatusReport.model_validate_json(run.stdout)


def until(check: Callable[[], Any], what: str, within: float = 60) -> Any:
    end = time.monotonic() + within
    while (value := check()) is None or value is False:
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_status_json_has_sessions_by_stage_heartbeat_ages_the_pool_and_throughput(
    served: Served, tmp_path: Path
) -> None:
    marker = tmp_path / "go"
    before = report(served)
    finished_before = before.throughput[0].finished
    assert [w.window_s for w in before.throughput] == [60, 300, 900]
    with PolarClient(served.url, served.token) as client:
        client.submit(waiting_task("status-stages", 3, marker))

        def holding() -> StatusReport | None:
            now = report(served)
            on_node = now.sessions.get("running", 0) + now.sessions.get("dispatched", 0) == 3
            return now if on_node and now.nodes and now.nodes[0].heartbeat_age_s is not None else None

        during = until(holding, "the sessions to be on the node, and a heartbeat")
        assert during.tasks.get("running", 0) + during.tasks.get("pending", 0) >= 1
        (node,) = during.nodes
        assert node.heartbeat_age_s is not None and 0 <= node.heartbeat_age_s < 10
        assert node.load.assigned == 3
        assert during.inference is not None and during.inference_error is None
        assert [g.node_id for g in during.inference.gateways] == [node.node_id]
        assert during.inference.gateways[0].pool is not None
        marker.touch()
        client.wait("status-stages", timeout=60)
    after = report(served)
    assert after.sessions.get("finished", 0) >= 3 and not after.sessions.get("running")
    assert after.throughput[0].finished == finished_before + 3
    assert after.throughput[0].per_minute == after.throughput[0].finished
    assert after.throughput[0].sampled_tokens > before.throughput[0].sampled_tokens
    assert after.throughput[2].finished >= after.throughput[0].finished
    assert after.server_time is not None and abs(after.server_time - time.time()) < 60

    table = polar_status(served)
    assert table.returncode == 0, table.stderr
    for title in ("tasks", "sessions", "nodes", "throughput", "inference pools", "heartbeat", "1 min", "15 min"):
        assert title in table.stdout, title


def test_watch_refreshes_then_stops_after_count(served: Served) -> None:
    run = polar_status(served, "--watch", "--interval", "0.3", "--count", "3")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("(Ctrl-C stops)") == 3 and run.stdout.count("throughput") == 3
    lines = polar_status(served, "--watch", "--json", "--interval", "0.3", "--count", "2").stdout.splitlines()
    assert len(lines) == 2
    assert all(StatusReport.model_validate_json(line).nodes for line in lines)


def test_watch_stops_cleanly_on_ctrl_c(served: Served, tmp_path: Path) -> None:
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    argv = [sys.executable, "-m", "polar_cli", "status", "--server", served.url, "--token", served.token,
            "--watch", "--interval", "0.3"]  # fmt: skip
    with out.open("w") as sink, err.open("w") as errors:
        proc = subprocess.Popen(argv, stdout=sink, stderr=errors, env=ENV)
    try:
        until(lambda: "throughput" in out.read_text(), "the first view")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "Traceback" not in err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watch_shows_an_error_while_the_server_is_gone_and_keeps_trying(tmp_path: Path) -> None:
    proc, url = start_serve(tmp_path / "data", tmp_path / "serve.log")
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    argv = [sys.executable, "-m", "polar_cli", "status", "--server", url, "--token", TOKEN, "--watch", "--json",
            "--interval", "0.3", "--count", "10"]  # fmt: skip
    try:
        with out.open("w") as sink, err.open("w") as errors:
            watcher = subprocess.Popen(argv, stdout=sink, stderr=errors, env=ENV)
        until(lambda: out.read_text().count("\n") >= 1, "the first refresh")
    finally:
        stop(proc)
    assert watcher.wait(timeout=60) == 0
    assert "Traceback" not in err.read_text()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 10 and "nodes" in lines[0]
    assert "error" in lines[-1] and url in lines[-1]["error"]

    human = subprocess.run([sys.executable, "-m", "polar_cli", "status", "--server", url, "--token", TOKEN,
                            "--watch", "--interval", "0.2", "--count", "2"],
                           capture_output=True, text=True, env=ENV, timeout=60)  # fmt: skip
    assert human.returncode == 0 and "Traceback" not in human.stderr
    assert human.stdout.count("retrying every 0.2s") == 2 and url in human.stdout


def test_the_nodes_table_says_whose_figures_it_shows() -> None:
    """A node's running/queued come from its last heartbeat and may lag the sessions the server has seen finish: the
    table labels them as the node's, beside the server's own count (assigned) and the heartbeat's age."""
    from rich.console import Console

    from polar_cli.commands.status import service_tables
    from polar_cli.models import NodeLoad, NodeStatus, Placement, ServiceStatus

    where = Placement(host="node017", scheduler="slurm", job_id="4242", step_id="0")
    node = NodeStatus(node_id="node-1", url="http://127.0.0.1:1", healthy=True, heartbeat_age_s=4.2,
                      load=NodeLoad(run_slots=8, running=4, queued=0, assigned=0), placement=where)  # fmt: skip
    status = ServiceStatus(tasks={"completed": 1}, sessions={"finished": 4}, nodes=[node])
    console = Console(width=400, record=True)
    console.print(service_tables(status))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "node" in line and "url" in line)
    assert [cell.strip() for cell in header.split("┃")[3:10]] == ["where", "health", "draining", "run slots",
                                                                 "assigned", "running at heartbeat",
                                                                 "queued at heartbeat"]  # fmt: skip
    row = next(line for line in text.splitlines() if "node-1" in line)
    assert [cell.strip() for cell in row.split("│")[3:4]] == ["slurm job 4242.0 on node017"]
    assert [cell.strip() for cell in row.split("│")[6:11]] == ["8", "0", "4", "0", "4.2s ago"]
    assert "running and queued: as the node reported them in its last heartbeat" in " ".join(text.split())
