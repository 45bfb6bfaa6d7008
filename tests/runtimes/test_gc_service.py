"""Cleanup of what a crash leaves, for real: ``polar serve`` processes killed with ``kill -9`` while their sessions run
(local processes, Docker containers), restarted on the same node, and ``polar runtimes gc`` between live and dead
gateways. The agents wait for a flag file, then make one model call (the scripted backend answers)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_cli.runtimes.docker import LABEL_NODE
from polar_cli.runtimes.scratch import OWNER_FILE
from tests.runtimes.conftest import TEST_IMAGE, gone
from tests.server.procs import REPO, Serve, client, gateway, gateway_metrics, serve_config, until_true, waiting_task
from tests.server.test_service import finished

# Bash only (the test image has no python or curl): wait for the flag, then one chat completion over /dev/tcp.
BASH_AGENT = r"""
while [ ! -e /flag/go ]; do sleep 0.1; done
rest=${OPENAI_BASE_URL#http://}; hostport=${rest%%/*}; path=/${rest#*/}
body='{"model":"polar","messages":[{"role":"user","content":"hi"}]}'
exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}"
head='POST %s/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n'
printf "$head"'Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$path" "$hostport" "$OPENAI_API_KEY" "${#body}" "$body" >&3
read -r status <&3
case "$status" in *" 200 "*) exit 0 ;; *) echo "proxy said: $status" >&2; exit 1 ;; esac
"""


def docker_task(task_id: str, samples: int, flag_dir: Path) -> dict[str, Any]:
    data = waiting_task(task_id, samples)
    data["runtime"] = {"backend": "docker", "image": TEST_IMAGE,
                       "mounts": [{"source": str(flag_dir), "target": "/flag", "read_only": True}]}  # fmt: skip
    data["agent"]["config"] = {"command": 'exec bash "$HOME/agent.sh"', "files": {"agent.sh": BASH_AGENT}}
    return data


def completed(status: Any, samples: int, attempts: list[int]) -> None:
    results = sorted(status.results, key=lambda r: r.sample_index)
    assert [r.sample_index for r in results] == list(range(samples))
    assert all(r.status == "completed" and r.num_completions >= 1 for r in results), [r.error for r in results]
    assert sorted(r.metadata["polar_attempt"] for r in results) == attempts


def containers(engine: Any, node: str) -> dict[str, Any]:
    found = engine.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"}, ignore_removed=True)
    return {c.id: c for c in found}


def polar(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip


def test_a_restarted_polar_serve_kills_the_local_sessions_a_kill_9_left_and_runs_them_again(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    marker, pids = tmp_path / "go", tmp_path / "pids"
    pids.mkdir()
    data = waiting_task("local-orphans", 2, marker)
    command = data["agent"]["config"]["command"]
    data["agent"]["config"]["command"] = f'echo $$ > "{pids}/$POLAR_SESSION_ID.$$"; {command}'
    runs = [Serve(tmp_path / "all", "--port", "0", "--config", str(config))]

    async def body() -> None:
        info = await runs[0].ready()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=data)

        async def two_waiting() -> bool:
            return len(list(pids.iterdir())) == 2

        await until_true(two_waiting, "both agents waiting")
        orphans = [int(path.suffix[1:]) for path in pids.iterdir()]
        scratch = sorted((tmp_path / "scratch").glob("local-*"))
        assert len(scratch) == 2 and all(json.loads((d / OWNER_FILE).read_text())["node_id"] == info["node_id"]
                                         for d in scratch)  # fmt: skip
        runs[0].kill9()
        assert not any(gone(pid, within=0.5) for pid in orphans)  # the kill left them running
        runs.append(Serve(tmp_path / "all", "--port", "0", "--config", str(config)))
        restarted = await runs[1].ready()
        assert restarted["node_id"] == info["node_id"]
        assert all(gone(pid) for pid in orphans)  # the sweep ran before the node took a session
        assert not any(d.exists() for d in scratch)
        swept = [line for line in runs[1].stderr().splitlines() if "runtime sweep (at start)" in line]
        assert len(swept) == 2 and all("is gone" in line for line in swept), runs[1].stderr()
        marker.touch()
        completed(await finished(restarted, "local-orphans"), 2, [2, 2])

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for process in runs:
            process.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One rollout server for the Docker tests (their gateways come and go)."""
    where = tmp_path_factory.mktemp("gc-server")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLAR_LOAD_PLUGINS", "")  # the autouse isolation is function-scoped
        process = Serve(where / "server", "--role", "server", "--port", "0", "--config",
                        str(serve_config(where, "server")))  # fmt: skip
    try:
        info = asyncio.run(process.ready())
        yield {**info, "config": where}
    finally:
        process.stop()


@pytest.fixture
def our_containers(docker_engine: Any) -> Iterator[list[str]]:
    """The node ids a test's gateways run under: whatever containers of theirs are left at the end are removed."""
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        for container in containers(docker_engine, node).values():
            container.remove(force=True, v=True)


@pytest.mark.docker
def test_a_restarted_gateway_removes_the_8_containers_a_kill_9_left_and_runs_the_sessions_again(
    tmp_path: Path, docker_engine: Any, server: dict[str, Any], our_containers: list[str]
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    pools = {"init_workers": 4, "run_slots": 8, "postrun_workers": 4}
    config = serve_config(tmp_path, "gw", gateway={"pipeline": pools})
    runs = [gateway(tmp_path, "gw", server, config, "token-gw")]

    async def body() -> None:
        gw = await runs[0].ready()
        our_containers.append(gw["node_id"])
        async with client(server) as http:
            await http.post("/rollout/task/submit", json=docker_task("eight", 8, flags))

        async def eight_running() -> bool:
            metrics = await gateway_metrics(gw["gateway_url"], gw["node_token"])
            return bool(metrics["stages"]["running"]["in_flight"] == 8)

        await until_true(eight_running, "eight sessions running", within=180)
        orphans = containers(docker_engine, gw["node_id"])
        assert len(orphans) == 8
        orphan_dirs = {d.name for d in (tmp_path / "scratch").glob("docker-*")}
        assert len(orphan_dirs) == 8
        runs[0].kill9()
        assert len(containers(docker_engine, gw["node_id"])) == 8  # the kill left them running
        runs.append(gateway(tmp_path, "gw", server, config, "token-gw"))
        again = await runs[1].ready()
        assert again["node_id"] == gw["node_id"]
        assert not set(orphans) & set(containers(docker_engine, gw["node_id"]))  # removed before it registered
        swept = [line for line in runs[1].stderr().splitlines() if "runtime sweep (at start)" in line]
        assert sorted(line.split(" docker container ")[1].split()[0] for line in swept) == sorted(
            c.name for c in orphans.values()
        ), runs[1].stderr()
        # the orphans' host dirs went with them: what is there now is the new run's (its re-dispatched sessions may be
        # making theirs: a dir can exist a moment before its owner file)
        assert not orphan_dirs & {d.name for d in (tmp_path / "scratch").glob("docker-*")}
        (flags / "go").touch()
        completed(await finished(server, "eight"), 8, [2] * 8)

    try:
        asyncio.run(body())
    finally:
        (flags / "go").touch()
        for process in runs:
            process.stop()


@pytest.mark.docker
def test_polar_runtimes_gc_lists_and_removes_only_a_dead_gateways_containers(
    tmp_path: Path, docker_engine: Any, server: dict[str, Any], our_containers: list[str]
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    config = serve_config(tmp_path, "gw", gateway={"pipeline": {"init_workers": 2, "run_slots": 2,
                                                                "postrun_workers": 2}})  # fmt: skip
    runs = [gateway(tmp_path, name, server, config, f"token-{name}") for name in ("dead", "live")]
    scratch = str(tmp_path / "scratch")

    def gc(*args: str) -> list[dict[str, Any]]:
        done = polar("runtimes", "gc", "--json", "--scratch-root", scratch, *args)
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = json.loads(done.stdout)["removed"]
        return rows

    async def body() -> None:
        dead, live = [await run.ready() for run in runs]
        our_containers.extend([dead["node_id"], live["node_id"]])
        async with client(server) as http:
            await http.post("/rollout/task/submit", json=docker_task("two-gateways", 4, flags))

        async def both_running() -> bool:
            loads = [await gateway_metrics(n["gateway_url"], n["node_token"]) for n in (dead, live)]
            return all(m["stages"]["running"]["in_flight"] == 2 for m in loads)

        await until_true(both_running, "two sessions running on each gateway", within=180)
        left = containers(docker_engine, dead["node_id"])
        kept = containers(docker_engine, live["node_id"])
        assert len(left) == len(kept) == 2
        runs[0].kill9()
        ours = {dead["node_id"], live["node_id"]}
        listed = [row for row in gc("--dry-run") if row["node_id"] in ours]  # other tests' leftovers may be listed
        assert sorted(row["name"] for row in listed) == sorted(c.name for c in left.values())
        assert {row["node_id"] for row in listed} == {dead["node_id"]} and {r["kind"] for r in listed} == {"container"}
        assert set(containers(docker_engine, dead["node_id"])) == set(left)  # a dry run removes nothing
        assert gc("--dry-run", "--node", live["node_id"]) == []  # a live gateway's: never
        table = polar("runtimes", "gc", "--node", dead["node_id"], "--scratch-root", scratch)
        assert table.returncode == 0, table.stderr
        assert all(c.name in table.stdout for c in left.values())
        assert containers(docker_engine, dead["node_id"]) == {}
        assert all(c.status == "running" for c in containers(docker_engine, live["node_id"]).values())
        assert set(kept) <= set(containers(docker_engine, live["node_id"]))
        (flags / "go").touch()
        completed(await finished(server, "two-gateways"), 4, [1, 1, 2, 2])

    try:
        asyncio.run(body())
    finally:
        (flags / "go").touch()
        for process in runs:
            process.stop()
