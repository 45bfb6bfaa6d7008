"""polar_cli.ray on a real Ray cluster: ``ray.cluster_utils.Cluster`` with three nodes (raylets) on this machine, the
rollout server in a detached actor, one gateway actor per node, the shell harness with the scripted backend."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polar_cli.client import as_task
from polar_cli.connect_file import ServerAddress
from polar_cli.errors import ConfigError, PolarError
from polar_cli.groups import GroupConfig
from polar_cli.ray import Fleet, FleetConfig, GatewayInfo, RayServer, actor_options, eligible, stop_server
from polar_cli.registry import LOAD_ENV
from tests.gateway.test_node import gone
from tests.server.procs import REPO, client, gateway_metrics, serve_config, until_true, waiting_task
from tests.server.test_service import finished, one_result_per_sample

DRAIN_S = 3.0
SERVER = "polar-server-test"


def test_nodes_get_gateways_by_label_and_room() -> None:
    config = FleetConfig(gateways_per_node=2, gateway_resources={"CPU": 1, "polar": 1}, node_labels={"pool": "rl"})
    node = {"NodeID": "n", "Alive": True, "Labels": {"pool": "rl"}, "Resources": {"CPU": 4.0, "polar": 2.0}}
    assert eligible(node, config)
    assert not eligible({**node, "Alive": False}, config)
    assert not eligible({**node, "Labels": {"pool": "eval"}}, config)
    assert not eligible({**node, "Resources": {"CPU": 4.0, "polar": 1.0}}, config)  # room for one of two
    assert eligible({"Alive": True}, FleetConfig())  # asking nothing: every alive node
    assert actor_options(config) == {"num_cpus": 1, "max_restarts": -1, "resources": {"polar": 1}}
    assert actor_options(FleetConfig(runtime={"env_vars": {"A": "1"}}))["runtime_env"] == {"env_vars": {"A": "1"}}


def test_a_misspelt_option_is_one_line() -> None:
    with pytest.raises(ConfigError, match="gateway_per_node"):
        Fleet.start(Path("/nowhere/polar-server.json"), gateway_per_node=2)


@contextlib.contextmanager
def raylet_env() -> Iterator[None]:
    """What a raylet started here inherits, so its workers and the polar serve they start see this tree and no
    installed plugin."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        env.setenv(LOAD_ENV, "")
        yield


@dataclass
class RayFleet:
    cluster: Any
    fleet: Fleet
    config: Path

    def add_node(self, **options: Any) -> Any:
        with raylet_env():
            node = self.cluster.add_node(num_cpus=1, **options)
        self.cluster.wait_for_nodes()
        return node

    @property
    def info(self) -> dict[str, Any]:
        return {"url": self.fleet.server.url, "token": self.fleet.server.token}

    def on(self, ray_node_id: str) -> GatewayInfo | None:
        return next((g for g in self.fleet.gateways(timeout=10) if g.ray_node_id == ray_node_id), None)


def _ray_or_skip() -> None:
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):  # CI installs the [ray] extra
            pytest.fail("ray is not installed: pip install -e '.[ray]'")
        pytest.skip("ray is not installed: pip install -e '.[ray]'")


@pytest.fixture(scope="module")
def ray_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayFleet]:
    _ray_or_skip()
    import ray
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray")
    config = serve_config(root, "serve", server={"heartbeat_interval_s": 1.0})
    with raylet_env():
        cluster = Cluster(initialize_head=True, connect=True,
                          head_node_args={"num_cpus": 1, "include_dashboard": False,
                                          "resources": {"polar_server": 1}})  # fmt: skip
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    fleet = None
    try:
        server = RayServer(
            data_dir=root / "server", name=SERVER, args=["--config", str(config)], resources={"polar_server": 1}
        )  # on the head node, which stays
        fleet = Fleet.start(server, gateway_args=["--config", str(config)], data_root=root / "gateways",
                            drain_timeout_s=DRAIN_S, watch_interval_s=1.0)  # fmt: skip
        yield RayFleet(cluster, fleet, config)
    finally:
        if fleet is not None:
            fleet.shutdown()
        stop_server(SERVER)
        ray.shutdown()
        cluster.shutdown()


async def nodes(info: dict[str, Any]) -> list[dict[str, Any]]:
    async with client(info) as http:
        return list((await http.get("/rollout/status")).json()["nodes"])


def node_token(gateway: GatewayInfo) -> str:
    return str(json.loads((gateway.data_dir / "serve.json").read_text())["node_token"])


def alive(cluster: Any) -> list[str]:
    return [node.node_id for node in cluster.list_all_nodes()]


def test_the_fleet_puts_one_gateway_on_each_node_and_runs_24_sessions(ray_fleet: RayFleet) -> None:
    gateways = ray_fleet.fleet.gateways()
    assert sorted(g.ray_node_id for g in gateways) == sorted(alive(ray_fleet.cluster))

    async def body() -> None:
        rows = {row["node_id"]: row for row in await nodes(ray_fleet.info)}
        for gateway in gateways:  # each says where Ray placed it
            placement = rows[gateway.node_id]["placement"]
            assert placement["scheduler"] == "ray" and placement["node"] == gateway.ray_node_id
            assert placement["host"] == gateway.node_ip
        async with client(ray_fleet.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("twenty-four", 24))
        results = one_result_per_sample(await finished(ray_fleet.info, "twenty-four"), 24)
        assert {r.metadata["node_id"] for r in results} == {g.node_id for g in gateways}

    asyncio.run(body())


def test_the_fleets_client_submits_and_collects_groups(ray_fleet: RayFleet) -> None:
    tasks = [as_task(waiting_task(f"group-{i}", 4)) for i in range(3)]

    async def body() -> list[Any]:
        async with ray_fleet.fleet.client() as polar:
            return [group async for group in polar.groups(tasks, GroupConfig())]

    groups = asyncio.run(body())
    assert sorted(g.task_id for g in groups) == ["group-0", "group-1", "group-2"]
    assert all(len(g.results) == 4 and not g.dropped for g in groups)


def test_a_node_that_leaves_takes_its_gateway_and_every_session_ends_once(ray_fleet: RayFleet, tmp_path: Path) -> None:
    cluster = ray_fleet.cluster
    leaving = cluster.list_all_nodes()[-1]  # a worker node, not the head
    victim = ray_fleet.on(leaving.node_id)
    assert victim is not None
    marker = tmp_path / "go"

    async def body() -> None:
        async with client(ray_fleet.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("leaving", 9, marker))
        token = node_token(victim)

        async def busy() -> bool:
            return bool((await gateway_metrics(victim.url, token))["stages"]["running"]["in_flight"] > 0)

        await until_true(busy, "sessions running on the node that leaves")
        cluster.remove_node(leaving, allow_graceful=False)
        await until_true(lambda: asyncio.sleep(0, gone(victim.pid)), "its gateway to end with it", 60)
        await until_true(lambda: asyncio.sleep(0, ray_fleet.on(leaving.node_id) is None), "the fleet to drop it")
        marker.touch()
        results = one_result_per_sample(await finished(ray_fleet.info, "leaving"), 9)  # each ended exactly once
        assert victim.node_id not in {r.metadata["node_id"] for r in results}
        assert 2 in {r.metadata["polar_attempt"] for r in results}  # what it held ran again elsewhere

    try:
        asyncio.run(body())
    finally:
        marker.touch()


def test_a_node_that_joins_gets_a_gateway_that_takes_work(ray_fleet: RayFleet) -> None:
    joined = ray_fleet.add_node()

    async def body() -> None:
        gateway = await until_true(lambda: asyncio.sleep(0, ray_fleet.on(joined.node_id)), "a gateway there", 120)
        rows = {row["node_id"]: row for row in await nodes(ray_fleet.info)}
        assert rows[gateway.node_id]["placement"]["node"] == joined.node_id
        async with client(ray_fleet.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("joined", 12))
        results = one_result_per_sample(await finished(ray_fleet.info, "joined"), 12)
        assert gateway.node_id in {r.metadata["node_id"] for r in results}

    asyncio.run(body())


def test_a_fleet_for_a_label_goes_only_on_the_nodes_with_it(ray_fleet: RayFleet, tmp_path: Path) -> None:
    labelled = ray_fleet.add_node(labels={"polar": "gateway"})
    fleet = Fleet.start(ray_fleet.fleet.server, node_labels={"polar": "gateway"}, data_root=tmp_path / "gateways",
                        gateway_args=["--config", str(ray_fleet.config)], drain_timeout_s=DRAIN_S)  # fmt: skip
    try:
        assert [g.ray_node_id for g in fleet.gateways()] == [labelled.node_id]
    finally:
        said = fleet.shutdown()
    assert len(said) == 1 and "Drained: 0 sessions finished here; 0 handed back" in said[0], said


def test_a_gateway_process_that_dies_is_restarted_by_ray_as_the_same_node(ray_fleet: RayFleet) -> None:
    head = ray_fleet.cluster.list_all_nodes()[0].node_id
    before = ray_fleet.on(head)
    assert before is not None
    os.kill(before.pid, signal.SIGKILL)

    async def restarted() -> GatewayInfo | None:
        now = ray_fleet.on(head)
        return now if now is not None and now.pid != before.pid else None

    after = asyncio.run(until_true(restarted, "Ray to restart the actor", 120))
    assert (after.node_id, after.data_dir) == (before.node_id, before.data_dir)  # rejoined as the same node


def test_a_gateway_with_a_wrong_token_fails_the_fleet_with_one_line(ray_fleet: RayFleet, tmp_path: Path) -> None:
    wrong = ServerAddress(url=ray_fleet.fleet.server.url, token="not-the-token")
    with pytest.raises(PolarError) as failed:
        Fleet.start(wrong, gateway_args=["--config", str(ray_fleet.config)], data_root=tmp_path / "gateways")
    said = str(failed.value)
    assert len(said.splitlines()) == 1, said
    assert f"the rollout server at {wrong.url} refused to register this gateway (401)" in said, said
    assert "the gateway on Ray node" in said


def test_shutting_the_fleet_down_drains_each_gateway_as_sigterm_does(ray_fleet: RayFleet, tmp_path: Path) -> None:
    """Last: it ends the fleet. Sessions held past the drain are handed back, as on SIGTERM."""
    marker = tmp_path / "go"
    gateways = ray_fleet.fleet.gateways()

    async def running() -> bool:
        loads = [await gateway_metrics(g.url, node_token(g)) for g in gateways]
        return sum(m["stages"]["running"]["in_flight"] for m in loads) == 3

    async def submit() -> None:
        async with client(ray_fleet.info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("at-shutdown", 3, marker))
        await until_true(running, "three sessions running")

    try:
        asyncio.run(submit())
        said = "\n".join(ray_fleet.fleet.shutdown())
        assert said.count("Draining: no new sessions") == len(gateways), said
        handed = [line for line in said.splitlines() if "handed back to the server" in line]
        assert sum(int(line.split(" handed back")[0].rsplit(";", 1)[1]) for line in handed) == 3, said
        assert all(gone(g.pid) for g in gateways)
    finally:
        marker.touch()
        with contextlib.suppress(Exception):
            ray_fleet.fleet.shutdown()
