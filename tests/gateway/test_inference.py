"""The gateway's side of the inference pool (issue 20), on a real GatewayNode (port 0) with the scripted backend and
the shell harness running a small agent that makes its model calls through the proxy over HTTP:

- a pause in ``wait`` mode between two model calls of a session holds its next call at the proxy (the harness sees
  no error); after ``resume(2)`` the session completes, its completions record versions 1 and 2, and its trace says
  so;
- a task's ``max_staleness`` cancels exactly the running sessions that fell too far behind (status ``stale``, the
  partial trace kept), and ``cancel_stale`` every running session older than a version;
- the ``/inference`` routes: the node token, 400 naming the field for a bad body, 400 for what the pool refuses;
- at register (and again when the server forgot the node) the gateway takes on the server's version and pause state.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from polar_cli.gateway.agent import GatewayAgent
from polar_cli.gateway.config import AgentConfig, GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import Completion, PolicyVersions, SessionResult, TaskRequest
from polar_cli.models.inference import PoolStatus
from polar_cli.node_protocol import CancelStaleAnswer
from tests.gateway.sim import until

# The agent: before model call k it waits for the file $GATE_k (when set); after call k it creates $MARK.k.
AGENT = """
import json, os, time, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
for turn in range(1, int(os.environ.get("CALLS", "2")) + 1):
    gate = os.environ.get(f"GATE_{turn}")
    while gate and not os.path.exists(gate):
        time.sleep(0.02)
    body = json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode()
    answer = json.load(urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers)))
    messages += [answer["choices"][0]["message"], {"role": "user", "content": "go on"}]
    open(os.environ["MARK"] + f".{turn}", "w").close()
print("done")
"""
SCRIPT = [{"content": "first answer"}, {"content": "second answer"}]


def task(task_id: str, env: dict[str, str], **extra: Any) -> TaskRequest:
    return TaskRequest.model_validate({
        "task_id": task_id,
        "instruction": f"do {task_id}",
        "timeout_seconds": 60,
        "agent": {"harness": "shell", "env": env,
                  "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}}},
        "metadata": {"script": SCRIPT},
        **extra,
    })  # fmt: skip


class Agents:
    """Each named session's gates and marks, as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def env(self, name: str, *gated: int) -> dict[str, str]:
        env = {"MARK": str(self.root / f"{name}.mark")}
        env.update({f"GATE_{turn}": str(self.root / f"{name}.gate{turn}") for turn in gated})
        return env

    def open(self, name: str, turn: int) -> None:
        (self.root / f"{name}.gate{turn}").touch()

    async def called(self, name: str, turn: int) -> None:
        """Until the agent of ``name`` has the answer of its model call ``turn``."""
        mark = self.root / f"{name}.mark.{turn}"
        await until(mark.exists, f"{name}'s model call {turn}")


def config(tmp_path: Path) -> GatewayConfig:
    return GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch",
                         pipeline={"init_workers": 4, "run_slots": 6, "postrun_workers": 2})  # fmt: skip


def client(node: GatewayNode) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {node.config.control_token}"}
    return httpx.AsyncClient(base_url=node.url or "", timeout=60, headers=headers)


async def pool(http: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None = None) -> PoolStatus:
    response = await http.request(method, f"/inference{path}", json=body)
    assert response.status_code == 200, response.text
    return PoolStatus.model_validate(response.json())


def versions(node: GatewayNode, session_id: str) -> list[int | None]:
    completions = node.pipeline.get(session_id).completions
    assert completions is not None
    return [c.policy_version for c in completions]


def test_a_pause_holds_the_next_model_call_and_resume_samples_it_under_version_2(tmp_path: Path) -> None:
    agents = Agents(tmp_path)

    async def body() -> tuple[SessionResult, list[Completion]]:
        async with GatewayNode(config(tmp_path)) as node, client(node) as http:
            job = await node.submit(task("paused", agents.env("paused", 2)))
            await agents.called("paused", 1)
            paused = await pool(http, "POST", "/pause", {"mode": "wait"})
            assert (paused.paused, paused.policy_version, paused.in_flight) == ("wait", 1, 0)
            agents.open("paused", 2)  # its next call reaches the proxy and is held there
            await until(lambda: node.inference().waiting == 1, "the held call")
            await asyncio.sleep(0.3)
            assert not (tmp_path / "paused.mark.2").exists() and node.pipeline.get(job.session_id).result is None
            resumed = await pool(http, "POST", "/resume", {"policy_version": 2})
            assert (resumed.paused, resumed.policy_version) == (None, 2)
            result = await node.pipeline.wait(job.session_id)
            assert (await pool(http, "GET", "")).policy_version == 2
            return result, list(node.pipeline.get(job.session_id).completions or [])

    result, completions = asyncio.run(body())
    assert result.status == "completed", result.error  # the harness saw no error: it waited, then went on
    assert result.metadata["run"]["exit_code"] == 0
    assert [c.policy_version for c in completions] == [1, 2]
    (trace,) = result.trajectory.traces  # prefix_merging: both calls in one trace
    recorded = trace.policy_versions
    assert recorded is not None and recorded.spans is not None
    assert (recorded.oldest, recorded.newest, recorded.per_completion) == (1, 2, [1, 2])
    assert [s.version for s in recorded.spans] == [1, 2] and recorded.spans[0].start == 0
    assert trace.response_ids[recorded.spans[1].start :] == completions[1].response_ids  # version 2's tokens


def test_max_staleness_cancels_exactly_the_sessions_too_far_behind_and_keeps_their_traces(tmp_path: Path) -> None:
    agents = Agents(tmp_path)
    tasks = {
        "strict": task("strict", agents.env("strict", 2), max_staleness=0),  # 1 call under v1: stale at v2
        "loose": task("loose", agents.env("loose", 2), max_staleness=1),  # 1 call under v1: stale at v3
        "fresh": task("fresh", agents.env("fresh", 1), max_staleness=0),  # no call yet: never stale
        "free": task("free", agents.env("free", 2)),  # no max_staleness: never cancelled by it
    }

    async def body() -> dict[str, SessionResult]:
        async with GatewayNode(config(tmp_path)) as node, client(node) as http:
            jobs = {name: await node.submit(t) for name, t in tasks.items()}
            ids = {name: job.session_id for name, job in jobs.items()}
            for name in ("strict", "loose", "free"):
                await agents.called(name, 1)
            await until(lambda: node.pipeline.get(ids["fresh"]).stage == "running", "fresh to run")
            await pool(http, "POST", "/resume", {})  # version 2: only strict is more than its limit behind
            stale = await node.pipeline.wait(ids["strict"])
            await asyncio.sleep(0.3)
            assert [n for n, i in ids.items() if node.pipeline.get(i).result is not None] == ["strict"]
            await pool(http, "POST", "/resume", {"policy_version": 3})  # loose is now 2 behind
            results = {"strict": stale, "loose": await node.pipeline.wait(ids["loose"])}
            for name in ("fresh", "free"):
                agents.open(name, 1)
                agents.open(name, 2)
            results |= {name: await node.pipeline.wait(ids[name]) for name in ("fresh", "free")}
            assert versions(node, ids["fresh"]) == [3, 3] and versions(node, ids["free"]) == [1, 3]
            return results

    results = asyncio.run(body())
    assert {name: r.status for name, r in results.items()} == {
        "strict": "stale", "loose": "stale", "fresh": "completed", "free": "completed"
    }  # fmt: skip
    strict = results["strict"]
    assert strict.error is not None and "behind the current 2" in strict.error and "max_staleness is 0" in strict.error
    assert strict.trajectory.status == "stale" and strict.num_completions == 1
    (trace,) = strict.trajectory.traces  # the partial trajectory is built and kept, as a cancelled one's
    assert trace.policy_versions == PolicyVersions(oldest=1, newest=1, per_completion=[1])
    assert "behind the current 3" in (results["loose"].error or "")


def test_cancel_stale_cancels_every_running_session_older_than_a_version(tmp_path: Path) -> None:
    agents = Agents(tmp_path)
    tasks = {
        "old": task("old", agents.env("old", 2)),  # its call under v1
        "new": task("new", agents.env("new", 1, 2)),  # its call under v2
        "none": task("none", agents.env("none", 1)),  # no call
    }

    async def body() -> tuple[list[str], list[str], dict[str, str], dict[str, SessionResult]]:
        async with GatewayNode(config(tmp_path)) as node, client(node) as http:
            ids = {name: (await node.submit(t)).session_id for name, t in tasks.items()}
            await agents.called("old", 1)
            await pool(http, "POST", "/resume", {})  # version 2; no task has max_staleness: nothing cancelled
            agents.open("new", 1)
            await agents.called("new", 1)
            await until(lambda: node.pipeline.get(ids["none"]).stage == "running", "none to run")
            first = CancelStaleAnswer.model_validate((await http.post("/inference/cancel_stale", content=b"")).json())
            second = await http.post("/inference/cancel_stale", json={"older_than": 3})
            answer = CancelStaleAnswer.model_validate(second.json())
            agents.open("none", 1)
            agents.open("none", 2)
            results = {name: await node.pipeline.wait(i) for name, i in ids.items()}
            return first.cancelled, answer.cancelled, ids, results

    first, second, ids, results = asyncio.run(body())
    assert first == [ids["old"]] and second == [ids["new"]]
    assert {name: r.status for name, r in results.items()} == {"old": "stale", "new": "stale", "none": "completed"}
    assert "older than 3" in (results["new"].error or "")
    assert results["new"].trajectory.traces[0].policy_versions == PolicyVersions(oldest=2, newest=2,
                                                                                 per_completion=[2])  # fmt: skip


def test_the_inference_routes_need_the_token_and_answer_bad_input_with_a_400(tmp_path: Path) -> None:
    async def body() -> dict[str, httpx.Response]:
        async with GatewayNode(config(tmp_path)) as node, client(node) as http:
            async with httpx.AsyncClient(base_url=node.url or "") as anonymous:
                out = {"anonymous": await anonymous.post("/inference/pause", json={})}
            out["status"] = await http.get("/inference")
            out["bad mode"] = await http.post("/inference/pause", json={"mode": "nap"})
            out["unknown field"] = await http.post("/inference/resume", json={"policy_versoin": 2})
            out["no body"] = await http.post("/inference/backends")
            out["not json"] = await http.post("/inference/cancel_stale", content=b"{")
            out["bad url"] = await http.post("/inference/backends", json={"url": "ftp://127.0.0.1:9"})
            out["remove unknown"] = await http.request("DELETE", "/inference/backends", json={"url": "http://x:1"})
            out["zero timeout"] = await http.post("/inference/load_weights", json={"path": "/w", "timeout_s": 0})
            out["pause keep"] = await http.post("/inference/pause", json={"mode": "keep"})
            out["resume"] = await http.post("/inference/resume", json={})
            return out

    out = asyncio.run(body())
    assert out["anonymous"].status_code == 401
    assert PoolStatus.model_validate(out["status"].json()).policy_version == 1
    for name in ("bad mode", "unknown field", "no body", "not json", "bad url", "remove unknown",
                 "zero timeout"):  # fmt: skip
        response = out[name]
        assert response.status_code == 400, (name, response.text)
        assert set(response.json()["error"]) == {"message", "type"}, name
    assert "mode" in out["bad mode"].json()["error"]["message"]
    assert "did you mean 'policy_version'" in out["unknown field"].json()["error"]["message"]
    assert "timeout_s" in out["zero timeout"].json()["error"]["message"]
    assert PoolStatus.model_validate(out["pause keep"].json()).paused == "keep"
    assert PoolStatus.model_validate(out["resume"].json()).model_dump(include={"paused", "policy_version"}) == {
        "paused": None, "policy_version": 2
    }  # fmt: skip


class StubServer:
    """The rollout server's register and heartbeat routes, answering the pool state a test sets; ``forget`` makes the
    next heartbeat a 401 (a server with a new database), so the node registers again."""

    def __init__(self, policy_version: int, paused: str | None) -> None:
        self.state: dict[str, Any] = {"policy_version": policy_version, "paused": paused}
        self.registers = 0
        self.forget = False
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        async def register(request: web.Request) -> web.Response:
            self.registers += 1
            return web.json_response({"node_id": "node-1", "heartbeat_interval_s": 0.1, **self.state})

        async def heartbeat(request: web.Request) -> web.Response:
            if self.forget:
                self.forget = False
                return web.json_response({"error": {"message": "unknown node", "type": "unauthorized"}}, status=401)
            return web.json_response({"ok": True, "cancel": []})

        app = web.Application()
        app.add_routes([web.post("/nodes/register", register), web.post("/nodes/{node_id}/heartbeat", heartbeat)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def test_a_registering_gateway_takes_on_the_servers_version_and_pause_and_again_on_re_register(
    tmp_path: Path,
) -> None:
    agents = Agents(tmp_path)

    async def body() -> tuple[list[PoolStatus], SessionResult]:
        server = StubServer(policy_version=5, paused="wait")
        url = await server.start()
        seen = []
        agent = GatewayAgent(AgentConfig(server_url=url, server_token="server-secret"), tmp_path / "data")
        try:
            async with GatewayNode(config(tmp_path), on_result=[agent.on_result]) as node:
                await agent.start(node)
                await agent.registered.wait()
                seen.append(node.inference())
                job = await node.submit(task("sync", agents.env("sync"), max_staleness=1))
                await until(lambda: node.inference().waiting == 1, "the first call, held by the server's pause")
                server.state = {"policy_version": 7, "paused": None}
                server.forget = True
                await until(lambda: server.registers == 2 and node.inference().paused is None, "the re-register")
                seen.append(node.inference())
                result = await node.pipeline.wait(job.session_id)
                assert versions(node, job.session_id) == [7, 7]
                await agent.close()
        finally:
            await server.close()
        return seen, result

    seen, result = asyncio.run(body())
    assert (seen[0].policy_version, seen[0].paused) == (5, "wait")
    assert (seen[1].policy_version, seen[1].paused) == (7, None)
    assert result.status == "completed"  # its first call was sampled under 7: not stale
