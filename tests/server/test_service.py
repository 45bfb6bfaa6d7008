"""The rollout service end to end: ``polar serve`` processes (server, gateways) on loopback, the shell harness with
the scripted backend, ``kill -9`` for failures and a real callback receiver."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.commands.serve import build_config
from polar_cli.models import SessionResult, TaskStatus, Trajectory
from tests.server.procs import (
    REPO,
    Receiver,
    Serve,
    client,
    free_port,
    gateway,
    gateway_metrics,
    serve_config,
    until_true,
    waiting_task,
)


async def finished(info: dict[str, Any], task_id: str) -> TaskStatus:
    async with client(info) as http:
        response = await http.get(f"/rollout/task/{task_id}", params={"wait": 120})
        status = TaskStatus.model_validate(response.json())
    assert status.state in ("completed", "failed"), status.model_dump_json(indent=1)[:3000]
    return status


def one_result_per_sample(status: TaskStatus, samples: int) -> list[SessionResult]:
    results = sorted(status.results, key=lambda r: r.sample_index)
    assert [r.sample_index for r in results] == list(range(samples))
    assert len({r.session_id for r in results}) == samples == len(status.sessions)
    assert set(status.sessions.values()) == {"finished"}
    assert all(r.status == "completed" and r.num_completions == 2 for r in results), [r.error for r in results]
    return results


def test_two_gateways_run_a_task_and_every_callback_reaches_a_late_receiver(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    receiver = Receiver(free_port())  # down until the task has finished
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    gateways: list[Serve] = []

    async def body() -> None:
        info = await server.ready()
        gateways.extend([gateway(tmp_path, "gw-a", info, config, "token-a"),
                         gateway(tmp_path, "gw-b", info, config, "token-b")])  # fmt: skip
        nodes = [await g.ready() for g in gateways]
        spec = waiting_task("six", 6, callback_url=receiver.url)
        submitted_at = time.monotonic()
        async with client(info) as http:
            submitted = (await http.post("/rollout/task/submit", json=spec)).json()
            assert submitted == {"task_id": "six", "status": "pending", "created": True}
            again = await http.post("/rollout/task/submit", json=spec)
            assert again.status_code == 200 and (again.json()["task_id"], again.json()["created"]) == ("six", False)
            conflict = await http.post("/rollout/task/submit", json={**spec, "instruction": "something else"})
            assert conflict.status_code == 409 and conflict.json()["error"]["type"] == "conflict"
            bad = await http.post("/rollout/task/submit", json={**spec, "agent": {"harness": "no-such-harness"}})
            assert bad.status_code == 400
        status = await finished(info, "six")
        results = one_result_per_sample(status, 6)
        assert {r.metadata["node_id"] for r in results} == {n["node_id"] for n in nodes}  # spread over both
        async with client(info) as http:
            overview = (await http.get("/rollout/status")).json()
        assert overview["tasks"] == {"completed": 1} and overview["pending_sessions"] == 0
        assert overview["pending_callbacks"] == 7  # the receiver is down: 6 results + the final status wait
        await asyncio.sleep(max(0.0, submitted_at + 10 - time.monotonic()))  # down for the first 10 seconds at least
        await receiver.start()
        try:
            await until_true(lambda: asyncio.sleep(0, len(receiver.by_key) == 7), "every callback")
        finally:
            await receiver.close()
        by_key = {key: copies[0] for key, copies in receiver.by_key.items()}  # a receiver drops repeated keys
        assert set(by_key) == {f"session_result:{r.session_id}" for r in results} | {"task_status:six"}
        for r in results:
            sent = by_key[f"session_result:{r.session_id}"]
            assert (sent["type"], sent["task_id"]) == ("session_result", "six")
            assert SessionResult.model_validate(sent["result"]) == r  # the same as what polling answers
        final = TaskStatus.model_validate(by_key["task_status:six"]["status"])
        assert final.state == "completed" and final.completed == 6
        assert receiver.acknowledged[-1] == "task_status:six"  # all seven were due at once: the status came last
        await check_tokens(info, nodes)

    try:
        asyncio.run(body())
    finally:
        for process in [*gateways, server]:
            process.stop()


async def check_tokens(info: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    """Control calls without the token, or with another node's, are 401 and change nothing."""
    a, b = nodes
    async with httpx.AsyncClient(base_url=info["url"], timeout=30) as anon, client(info) as http:
        before = (await http.get("/rollout/status")).json()
        spec = waiting_task("intruder", 1)
        assert (await anon.post("/rollout/task/submit", json=spec)).status_code == 401
        assert (await anon.get("/rollout/status")).status_code == 401
        assert (await anon.delete(f"/nodes/{a['node_id']}")).status_code == 401
        assert (await anon.delete("/rollout/task/six")).status_code == 401
        fake = {"url": "http://127.0.0.1:9", "token": "x", "capacity": {"run_slots": 1}}
        assert (await anon.post("/nodes/register", json=fake)).status_code == 401
        wrong = {"Authorization": f"Bearer {b['node_token']}"}
        beat = {"load": {"run_slots": 9, "running": 9}, "sessions": []}
        assert (await anon.post(f"/nodes/{a['node_id']}/heartbeat", json=beat, headers=wrong)).status_code == 401
        server_token = {"Authorization": f"Bearer {info['token']}"}
        assert (await anon.post(f"/nodes/{a['node_id']}/heartbeat", json=beat, headers=server_token)).status_code == 401
        status = TaskStatus.model_validate((await http.get("/rollout/task/six")).json())
        forged = status.results[0].model_copy(update={"status": "error", "error": "forged"})
        callback = {"node_id": a["node_id"], "session_id": forged.session_id, "attempt": 1,
                    "result": forged.model_dump(mode="json")}  # fmt: skip
        assert (await anon.post("/callbacks/session_result", json=callback, headers=wrong)).status_code == 401
        assert (await anon.post("/callbacks/session_result", json=callback)).status_code == 401
        await check_results_are_tied_to_attempts(info, a, b, status)
        assert (await anon.post(f"{a['gateway_url']}/sessions", json={"task": spec})).status_code == 401
        assert (await http.get("/rollout/task/intruder")).status_code == 404
        after = (await http.get("/rollout/status")).json()
        assert TaskStatus.model_validate((await http.get("/rollout/task/six")).json()) == status
        assert [(n["node_id"], n["url"], n["draining"]) for n in after["nodes"]] == [
            (n["node_id"], n["url"], n["draining"]) for n in before["nodes"]
        ]
        assert all(n["load"]["running"] != 9 for n in after["nodes"])
        assert (await anon.get("/healthz")).json() == {"ok": True}
        drained = await http.delete(f"/nodes/{a['node_id']}")
        assert drained.json() == {"node_id": a["node_id"], "draining": True}
        nodes = {n["node_id"]: n for n in (await http.get("/rollout/status")).json()["nodes"]}
        assert nodes[a["node_id"]]["draining"] and not nodes[b["node_id"]]["draining"]


def report(node: dict[str, Any], result: SessionResult, attempt: int = 1) -> dict[str, Any]:
    """What ``node`` would POST to /callbacks/session_result for ``result``, with its own token."""
    body = {"node_id": node["node_id"], "session_id": result.session_id, "attempt": attempt,
            "result": result.model_dump(mode="json")}  # fmt: skip
    return {"json": body, "headers": {"Authorization": f"Bearer {node['node_token']}"}}


async def check_results_are_tied_to_attempts(
    info: dict[str, Any], a: dict[str, Any], b: dict[str, Any], status: TaskStatus
) -> None:
    """A node's valid token reports only what was sent to that node: another node's session is 403, its own
    finished one a duplicate; neither changes anything."""
    ran_on_a = next(r for r in status.results if r.metadata["node_id"] == a["node_id"])
    forged = ran_on_a.model_copy(update={"status": "error", "error": "forged", "metadata": {}})
    async with httpx.AsyncClient(base_url=info["url"], timeout=30) as anon:
        refused = await anon.post("/callbacks/session_result", **report(b, forged))
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
        assert (await anon.post("/callbacks/session_result", **report(a, forged, attempt=2))).status_code == 403
        again = await anon.post("/callbacks/session_result", **report(a, forged))
        assert again.json() == {"accepted": True, "duplicate": True}


def test_sessions_of_a_killed_gateway_are_dispatched_again_elsewhere(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    marker = tmp_path / "go"
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    gateways: list[Serve] = []

    async def body() -> None:
        info = await server.ready()
        gateways.extend([gateway(tmp_path, "gw-a", info, config, "token-a"),
                         gateway(tmp_path, "gw-b", info, config, "token-b")])  # fmt: skip
        a, b = [await g.ready() for g in gateways]
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("survivor", 6, marker))

        async def both_running() -> bool:
            loads = [await gateway_metrics(n["gateway_url"], n["node_token"]) for n in (a, b)]
            return all(m["stages"]["running"]["in_flight"] == 3 for m in loads)

        await until_true(both_running, "three sessions running on each gateway")
        async with client(info) as http, httpx.AsyncClient(timeout=30) as anon:
            status = TaskStatus.model_validate((await http.get("/rollout/task/survivor")).json())
            held = {"Authorization": f"Bearer {a['node_token']}"}
            on_a = [s for s in status.sessions if (await anon.get(f"{a['gateway_url']}/sessions/{s}",
                                                                   headers=held)).status_code == 200]  # fmt: skip
            assert len(on_a) == 3
            fake = SessionResult(session_id=on_a[0], task_id="survivor", status="completed",
                                 trajectory=Trajectory(status="completed"))  # fmt: skip
            refused = await http.post("/callbacks/session_result", **report(b, fake))  # b's token, a's session
            assert refused.status_code == 403
            assert (await http.get("/rollout/task/survivor")).json()["sessions"][on_a[0]] in ("dispatched", "running")
        gateways[0].kill9()

        async def moved() -> bool:
            metrics = await gateway_metrics(b["gateway_url"], b["node_token"])
            return bool(metrics["sessions"]["active"] == 6)

        await until_true(moved, "the killed gateway's sessions on the other one")
        async with client(info) as http:
            nodes = {n["node_id"]: n for n in (await http.get("/rollout/status")).json()["nodes"]}
        assert not nodes[a["node_id"]]["healthy"] and nodes[b["node_id"]]["healthy"]
        marker.touch()
        results = one_result_per_sample(await finished(info, "survivor"), 6)
        assert {r.metadata["node_id"] for r in results} == {b["node_id"]}
        assert sorted(r.metadata["polar_attempt"] for r in results) == [1, 1, 1, 2, 2, 2]

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for process in [*gateways, server]:
            process.stop()


def test_heartbeats_find_sessions_a_live_gateway_lost_or_could_not_report(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    marker = tmp_path / "go"
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    node: list[Serve] = []

    async def body() -> None:
        info = await server.ready()
        (tmp_path / "gw").mkdir()
        (tmp_path / "gw" / "results").write_text("a file: the gateway can store no result, so it reports none")
        node.append(gateway(tmp_path, "gw", info, config, "token-gw"))
        gw = await node[0].ready()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("lost", 2, marker))

        async def two_running() -> bool:
            metrics = await gateway_metrics(gw["gateway_url"], gw["node_token"])
            return bool(metrics["stages"]["running"]["in_flight"] == 2)

        await until_true(two_running, "two sessions running")
        async with client(info) as http, httpx.AsyncClient(timeout=30) as anon:
            lost = sorted(TaskStatus.model_validate((await http.get("/rollout/task/lost")).json()).sessions)[0]
            held = {"Authorization": f"Bearer {gw['node_token']}"}
            cancelled = await anon.delete(f"{gw['gateway_url']}/sessions/{lost}", headers=held)  # the gateway drops it
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        marker.touch()
        results = one_result_per_sample(await finished(info, "lost"), 2)
        attempts = {r.session_id: r.metadata["polar_attempt"] for r in results}
        assert attempts.pop(lost) == 2 and list(attempts.values()) == [1]  # dropped: run again; the other: found
        assert all("persist_error" in r.metadata for r in results)  # neither came by callback

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for process in [*node, server]:
            process.stop()


def test_a_draining_stop_lets_running_sessions_finish(tmp_path: Path) -> None:
    marker = tmp_path / "go"
    args = ("--port", "0", "--drain-timeout", "300", "--config", str(serve_config(tmp_path, "serve")))
    runs = [Serve(tmp_path / "polar-data", *args)]

    async def body() -> None:
        info = await runs[0].ready()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("drained", 2, marker))

        async def two_running() -> bool:
            metrics = await gateway_metrics(info["gateway_url"], info["node_token"])
            return bool(metrics["stages"]["running"]["in_flight"] == 2)

        await until_true(two_running, "two sessions running")
        runs[0].proc.send_signal(signal.SIGTERM)

        async def draining() -> bool:
            async with client(info) as http:
                return bool((await http.get("/rollout/status")).json()["nodes"][0]["draining"])

        await until_true(draining, "the node draining")
        async with client(info) as http, httpx.AsyncClient(timeout=30) as anon:
            await http.post("/rollout/task/submit", json=waiting_task("later", 1))  # taken, not started
            held = {"Authorization": f"Bearer {info['node_token']}"}
            spec = {"task": waiting_task("direct", 1)}
            assert (await anon.post(f"{info['gateway_url']}/sessions", json=spec, headers=held)).status_code == 503
            assert (await http.get("/rollout/task/later")).json()["sessions"] != {}
        marker.touch()
        assert await asyncio.to_thread(runs[0].proc.wait, 120) == 0
        assert "Draining: no new sessions; waiting up to 300 s for the 2 under way" in runs[0].stderr()
        runs.append(Serve(tmp_path / "polar-data", *args))
        restarted = await runs[1].ready()
        results = one_result_per_sample(await finished(restarted, "drained"), 2)
        assert [r.metadata["polar_attempt"] for r in results] == [1, 1]  # finished while draining: not run again
        later = one_result_per_sample(await finished(restarted, "later"), 1)
        assert later[0].metadata["polar_attempt"] == 1  # never sent to the draining node

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for process in runs:
            process.stop()


def test_a_killed_server_restarts_on_its_data_dir_and_loses_nothing(tmp_path: Path) -> None:
    # two run slots and no queue on the node: four sessions are still pending when the server dies
    config = serve_config(tmp_path, "serve", server={"max_queued_per_node": 0},
                          gateway={"pipeline": {"init_workers": 2, "run_slots": 2, "postrun_workers": 2}})  # fmt: skip
    marker = tmp_path / "go"
    port = str(free_port())
    args = ("--role", "server", "--port", port, "--config", str(config))
    servers = [Serve(tmp_path / "server", *args)]
    node: list[Serve] = []

    async def body() -> None:
        info = await servers[0].ready()
        node.append(gateway(tmp_path, "gw", info, config, "token-gw"))
        gw = await node[0].ready()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("phoenix", 6, marker))
            status = TaskStatus.model_validate((await http.get("/rollout/task/phoenix")).json())
        assert status.state in ("pending", "running")

        async def two_running() -> bool:
            metrics = await gateway_metrics(gw["gateway_url"], gw["node_token"])
            return bool(metrics["stages"]["running"]["in_flight"] == 2)

        await until_true(two_running, "two sessions running")
        servers[0].kill9()
        marker.touch()  # the two running sessions finish while the server is down: the gateway keeps their results

        async def reported() -> bool:
            return len(list((tmp_path / "gw" / "results").glob("*.json"))) == 2

        await until_true(reported, "two results held by the gateway")
        servers.append(Serve(tmp_path / "server", *args))  # same data dir and port, no token given: it was kept
        restarted = await servers[1].ready()
        assert restarted["token"] == info["token"] and restarted["url"] == info["url"]
        results = one_result_per_sample(await finished(restarted, "phoenix"), 6)
        assert {r.metadata["node_id"] for r in results} == {gw["node_id"]}

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for process in [*node, *servers]:
            process.stop()


def test_polar_serve_alone_runs_server_and_gateway_in_one_process(tmp_path: Path) -> None:
    serve = Serve(tmp_path / "polar-data", "--port", "0")

    async def body() -> None:
        info = await serve.ready()
        assert info["role"] == "all" and info["gateway_url"] and info["node_id"]
        assert "POLAR_SERVE role=all url=" + info["url"] in serve.output()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("solo", 2))
            cancelled = await http.post("/rollout/task/submit", json=waiting_task("stop", 1, tmp_path / "never"))
            assert cancelled.status_code == 200
            stopped = TaskStatus.model_validate((await http.delete("/rollout/task/stop")).json())
            assert stopped.state == "cancelled" and list(stopped.sessions.values()) == ["cancelled"]
        one_result_per_sample(await finished(info, "solo"), 2)

    try:
        asyncio.run(body())
    finally:
        serve.stop()
    assert serve.proc.returncode == 0 and "Stopped." in serve.output()


def test_a_bad_topology_file_names_the_field_and_the_file(tmp_path: Path) -> None:
    example = build_config(REPO / "configs" / "serve.yaml", None, {"port": 0})
    assert (example.role, example.server.port, example.gateway.proxy.backend) == ("all", 0, "scripted")
    bad = tmp_path / "serve.yaml"
    bad.write_text("role: server\nserver:\n  heartbeat_interval: 1\n")
    run = subprocess.run([sys.executable, "-m", "polar_cli", "serve", "--config", str(bad)], capture_output=True,
                         text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"{bad}: invalid ServeConfig: unknown field 'server.heartbeat_interval'" in run.stderr
    assert "did you mean 'heartbeat_interval_s'?" in run.stderr and "Traceback" not in run.stderr


def test_callbacks_for_a_task_end_with_its_status_after_every_session_result(tmp_path: Path) -> None:
    # the receiver refuses each session result once: the last one is sent again after the task has ended
    receiver = Receiver(free_port(), refuse_first=True)
    serve = Serve(tmp_path / "polar-data", "--port", "0", "--config", str(serve_config(tmp_path, "serve")))

    async def body() -> None:
        await receiver.start()
        try:
            info = await serve.ready()
            async with client(info) as http:
                await http.post("/rollout/task/submit", json=waiting_task("ordered", 3, callback_url=receiver.url))
            results = one_result_per_sample(await finished(info, "ordered"), 3)
            await until_true(lambda: asyncio.sleep(0, "task_status:ordered" in receiver.acknowledged), "the status")
        finally:
            await receiver.close()
        sessions = {f"session_result:{r.session_id}" for r in results}
        assert receiver.acknowledged == [*receiver.acknowledged[:3], "task_status:ordered"]
        assert set(receiver.acknowledged[:3]) == sessions
        assert all(len(receiver.by_key[key]) == 2 for key in sessions)  # each refused once, then taken
        assert len(receiver.by_key["task_status:ordered"]) == 1  # sent once, when nothing was left before it

    try:
        asyncio.run(body())
    finally:
        serve.stop()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_polar_serve_keeps_its_data_in_polar_data_and_stops_on_a_signal_with_a_note(
    tmp_path: Path, stop: signal.Signals
) -> None:
    """No --data-dir: ./polar-data (never a folder named None). A signal stops it within seconds, a session under way
    included (cancelled: the server runs it again after a restart), and one line says where the data is."""
    marker = tmp_path / "never"
    serve = Serve(tmp_path / "polar-data", "--port", "0", "--config", str(serve_config(tmp_path, "s")),
                  default_data_dir=True)  # fmt: skip

    async def body() -> None:
        info = await serve.ready()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("cut-off", 1, marker))

        async def running() -> bool:
            metrics = await gateway_metrics(info["gateway_url"], info["node_token"])
            return bool(metrics["stages"]["running"]["in_flight"] == 1)

        await until_true(running, "the session running")

    try:
        asyncio.run(body())
        sent = time.monotonic()
        serve.proc.send_signal(stop)
        code = serve.proc.wait(30)
        took = time.monotonic() - sent
    finally:
        serve.stop()
    # the session never ends by itself (its marker is never written): exiting within the 30 s wait is the cut-off
    assert code == 0, (code, took, serve.output())
    assert "(role: all; data: polar-data)" in serve.stdout() and (tmp_path / "polar-data" / "server.db").exists()
    assert not (tmp_path / "None").exists()
    assert serve.stderr().strip().splitlines()[-1] == (
        "Stopped. Tasks, sessions and results are kept in polar-data; starting again with --data-dir polar-data "
        "resumes them (sessions that were cut off run again)."
    )


def test_a_paused_server_does_not_take_its_gateway_for_dead(tmp_path: Path) -> None:
    """The process stops for longer than a node may stay silent (SIGSTOP: as when its event loop is blocked): the
    heartbeats it could not read are not the node's fault, so nothing is re-dispatched."""
    marker = tmp_path / "go"
    serve = Serve(tmp_path / "polar-data", "--verbose", "--port", "0", "--config", str(serve_config(tmp_path, "s")))

    async def body() -> None:
        info = await serve.ready()
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("paused", 2, marker))

        async def two_running() -> bool:
            metrics = await gateway_metrics(info["gateway_url"], info["node_token"])
            return bool(metrics["stages"]["running"]["in_flight"] == 2)

        await until_true(two_running, "two sessions running")
        serve.proc.send_signal(signal.SIGSTOP)
        await asyncio.sleep(3)  # dead after 0.75 s of silence
        serve.proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(1)
        marker.touch()
        results = one_result_per_sample(await finished(info, "paused"), 2)
        assert [r.metadata["polar_attempt"] for r in results] == [1, 1]

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        serve.stop()
    assert "missed its heartbeats" not in serve.output()
