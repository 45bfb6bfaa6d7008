"""Many gateways against one rollout server, as a cluster starts them: several on one host without a port each, and
the input a job script gets wrong (a server that cannot be reached, a wrong token, one node id claimed twice). Real
``polar serve`` processes on loopback, the shell harness with the scripted backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.registry import LOAD_ENV
from tests.server.procs import Serve, client, serve_config, waiting_task
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
    config = serve_config(root, "serve")
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
