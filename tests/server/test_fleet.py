"""Many gateways against one rollout server, as a cluster starts them: several on one host without a port each, and
the input a job script gets wrong (a server that cannot be reached, a wrong token, one node id claimed twice). Real
``polar serve`` processes on loopback, the shell harness with the scripted backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.errors import EXIT_UNREACHABLE, EXIT_USAGE
from polar_cli.models import Placement
from polar_cli.registry import LOAD_ENV
from tests.server.procs import (
    REPO,
    Serve,
    client,
    free_port,
    gateway_metrics,
    serve_config,
    until_true,
    waiting_task,
)
from tests.server.test_service import finished, one_result_per_sample


@dataclass
class Server:
    info: dict[str, Any]
    config: Path
    root: Path

    def gateway(self, name: str, *args: str) -> Serve:
        """A gateway started as a job script would: no ``--port``; the token only in its environment."""
        return Serve(self.root / name, "--role", "gateway", "--config", str(self.config), "--server",
                     self.info["url"], "--server-token", self.info["token"], *args)  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("fleet")
    # a slow heartbeat: a gateway killed and started again is back before the server takes it for dead, so its
    # register is judged by probing its old URL
    config = serve_config(root, "serve", server={"heartbeat_interval_s": 5.0}, agent={"register_timeout_s": 2.0})
    with pytest.MonkeyPatch.context() as env:
        env.setenv(LOAD_ENV, "")  # as tests/conftest.py does for each test: no stray installed plugin
        proc = Serve(root / "server", "--role", "server", "--port", "0", "--config", str(config))
    try:
        yield Server(asyncio.run(proc.ready()), config, root)
    finally:
        proc.stop()


async def nodes(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    async with client(info) as http:
        return {n["node_id"]: n for n in (await http.get("/rollout/status")).json()["nodes"]}


def test_two_gateways_on_one_host_take_free_ports_and_share_a_task(server: Server) -> None:
    # the second names its public URL without a port, as a job script does before the port is known
    gateways = [server.gateway("gw-a"), server.gateway("gw-b", "--public-url", "http://127.0.0.1")]

    async def body() -> None:
        a, b = [await g.ready() for g in gateways]
        assert a["gateway_url"] != b["gateway_url"]
        known = await nodes(server.info)
        for node in (a, b):
            assert known[node["node_id"]]["url"] == node["gateway_url"]  # the bound port, as the server reaches it
            async with httpx.AsyncClient(timeout=10) as anon:
                assert (await anon.get(f"{node['gateway_url']}/healthz")).json() == {"ok": True}
        async with client(server.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("two-on-one-host", 8))
        results = one_result_per_sample(await finished(server.info, "two-on-one-host"), 8)
        assert {r.metadata["node_id"] for r in results} == {a["node_id"], b["node_id"]}

    try:
        asyncio.run(body())
    finally:
        for process in gateways:
            process.stop()


def exits_with_one_line(gateway: Serve) -> str:
    """The gateway exits by itself; its last line on stderr is its error, and there is no traceback."""
    assert gateway.proc.wait(60) != 0
    gateway.stop()
    lines = gateway.stderr().strip().splitlines()
    assert "Traceback" not in gateway.stderr() and lines[-1].startswith("Error: "), gateway.stderr()
    return lines[-1]


def test_a_gateway_without_a_server_says_where_and_why_and_exits(server: Server, tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    unreachable = Serve(tmp_path / "gw-x", "--role", "gateway", "--config", str(server.config), "--server", nobody,
                        "--server-token", server.info["token"])  # fmt: skip
    line = exits_with_one_line(unreachable)
    assert line.startswith(f"Error: cannot register with the rollout server at {nobody}: ") and "2 s" in line
    assert unreachable.proc.returncode == EXIT_UNREACHABLE
    assert f"cannot register with the rollout server at {nobody}" in unreachable.stderr().splitlines()[0]  # retried

    wrong = server.gateway("gw-y", "--server-token", "not-the-token")
    line = exits_with_one_line(wrong)
    assert line.startswith(f"Error: the rollout server at {server.info['url']} refused to register this gateway (401)")
    assert line.endswith("(check --server-token or $POLAR_SERVER_TOKEN)") and wrong.proc.returncode == EXIT_UNREACHABLE
    assert "retrying" not in wrong.stderr()


def test_one_node_id_is_refused_to_a_second_live_gateway_but_not_to_its_restart(server: Server) -> None:
    first = server.gateway("gw-one", "--node-id", "node-twice")
    started: list[Serve] = [first]

    async def body() -> None:
        one = await first.ready()
        assert one["node_id"] == "node-twice"
        second = server.gateway("gw-two", "--node-id", "node-twice")  # the same id on another "host"
        started.append(second)
        line = exits_with_one_line(second)
        assert f"(409): node id 'node-twice' is held by a live gateway at {one['gateway_url']}" in line
        assert second.proc.returncode == EXIT_USAGE
        assert (await nodes(server.info))["node-twice"]["url"] == one["gateway_url"]  # the first one is untouched

        first.kill9()  # then started again on its data dir, at once: a new port, the same node id (node.json)
        again = Serve(first.data_dir, "--role", "gateway", "--config", str(server.config), "--server",
                      server.info["url"], "--server-token", server.info["token"])  # fmt: skip
        started.append(again)
        restarted = await again.ready()
        assert restarted["node_id"] == "node-twice" and restarted["gateway_url"] != one["gateway_url"]
        known = (await nodes(server.info))["node-twice"]
        assert known["url"] == restarted["gateway_url"] and known["healthy"]
        async with client(server.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("after-restart", 2))
        results = one_result_per_sample(await finished(server.info, "after-restart"), 2)
        assert {r.metadata["node_id"] for r in results} == {"node-twice"}  # the only gateway up: it takes work

    try:
        asyncio.run(body())
    finally:
        for process in started:
            process.stop()


RAY_NODE = "3f2a1b0c" * 7


@pytest.mark.parametrize(
    ("env", "placement", "shown"),
    [({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURMD_NODENAME": "node017"},  # what slurmstepd gives srun's task
      {"host": "node017", "scheduler": "slurm", "job_id": "4242", "step_id": "3", "node": None},
      "slurm job 4242.3 on node017"),
     ({"POLAR_RAY_NODE_ID": RAY_NODE, "POLAR_RAY_NODE_IP": "10.0.0.5"},  # what polar_cli.ray gives its gateways
      {"host": "10.0.0.5", "scheduler": "ray", "job_id": None, "step_id": None, "node": RAY_NODE},
      "ray node 3f2a1b0c on 10.0.0.5")],
    ids=["slurm", "ray"],
)  # fmt: skip
def test_a_gateway_says_where_its_scheduler_placed_it(
    server: Server, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], placement: dict[str, Any], shown: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gateway = server.gateway(f"gw-{placement['scheduler']}")
    try:
        node = asyncio.run(gateway.ready())
        done = subprocess.run([sys.executable, "-m", "polar_cli", "status", "--server", server.info["url"],
                                "--token", server.info["token"], "--json"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                               timeout=60, check=True)  # fmt: skip
    finally:
        gateway.stop()
    row = next(n for n in json.loads(done.stdout)["nodes"] if n["node_id"] == node["node_id"])
    assert row["placement"] == placement
    assert Placement.model_validate(placement).describe() == shown  # the nodes table's "where"


def test_gateways_find_the_server_through_its_connect_file(tmp_path: Path) -> None:
    """The gateway starts first and waits for the file; neither command line holds the token; the file is 0600."""
    config = serve_config(tmp_path, "serve", agent={"register_timeout_s": 60.0})
    shared = tmp_path / "shared" / "polar-server.json"
    gateway = Serve(tmp_path / "gw", "--role", "gateway", "--config", str(config), "--connect-file", str(shared))
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config),
                   "--host", "0.0.0.0", "--public-url", "http://127.0.0.1", "--connect-file", str(shared))  # fmt: skip

    async def body() -> None:
        info = await server.ready()
        node = await gateway.ready()
        address = json.loads(shared.read_text())
        port = info["url"].rsplit(":", 1)[1]
        assert address == {"url": f"http://127.0.0.1:{port}", "token": info["token"]}
        assert shared.stat().st_mode & 0o777 == 0o600
        for process in (server, gateway):  # nor in what it prints (a job's log may be readable by others)
            assert info["token"] not in Path(f"/proc/{process.proc.pid}/cmdline").read_text()
            assert info["token"] not in process.stdout() + process.stderr()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("through-the-file", 2))
        results = one_result_per_sample(await finished(info, "through-the-file"), 2)
        assert {r.metadata["node_id"] for r in results} == {node["node_id"]}

    try:
        asyncio.run(body())
    finally:
        for process in (gateway, server):
            process.stop()
    quick = serve_config(tmp_path, "quick", agent={"register_timeout_s": 1.0})
    nowhere = tmp_path / "nowhere.json"
    lost = Serve(tmp_path / "gw-lost", "--role", "gateway", "--config", str(quick), "--connect-file", str(nowhere))
    line = exits_with_one_line(lost)
    assert line.startswith(f"Error: no rollout server wrote the connect file {nowhere} within 1 s")


def test_a_drain_that_runs_out_of_time_hands_its_sessions_back_and_says_so(server: Server, tmp_path: Path) -> None:
    marker = tmp_path / "go"
    stopping = server.gateway("gw-stopping", "--drain-timeout", "1")
    staying = server.gateway("gw-staying")

    async def body() -> None:
        a, b = await stopping.ready(), await staying.ready()
        async with client(server.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("handed-back", 6, marker))

        async def both_running() -> bool:
            loads = [await gateway_metrics(n["gateway_url"], n["node_token"]) for n in (a, b)]
            return all(m["stages"]["running"]["in_flight"] == 3 for m in loads)

        await until_true(both_running, "three sessions running on each gateway")
        stopping.proc.send_signal(signal.SIGTERM)  # what scancel and a job's --signal send
        assert await asyncio.to_thread(stopping.proc.wait, 60) == 0  # a stop asked for is a clean exit
        said = stopping.stderr()
        handed = said.split("handed back to the server (cancelled here, to run again elsewhere): ")[1].split()[:3]
        assert "Drained: 0 sessions finished here; 3 handed back" in said, said
        marker.touch()
        results = one_result_per_sample(await finished(server.info, "handed-back"), 6)
        assert {r.metadata["node_id"] for r in results} == {b["node_id"]}
        again = {r.session_id: r.metadata["polar_attempt"] for r in results}
        assert sorted(again[sid] for sid in handed) == [2, 2, 2]
        assert sorted(again.values()) == [1, 1, 1, 2, 2, 2]

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for process in (stopping, staying):
            process.stop()
