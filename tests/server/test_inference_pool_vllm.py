"""Two real vLLM CPU servers behind the one gateway of a real ``polar serve`` (``--backend vllm --backend-url A
--backend-url B``): sessions spread over both, a ``kill -9`` of one mid-run costs no session, and the replica, removed
and added back through the rollout server, takes load again.

The servers are the run's shared pair (tests/support/vllm.py; the killed one is restarted on its port). Without the
vLLM venv the test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_cli.client import AsyncPolarClient
from polar_cli.models import Completion
from polar_cli.proxy.journal import read_journal
from tests.support.vllm import MODEL_NAME, VllmServer, vllm_pair

from .procs import Serve, serve_config, until_true

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_pair"]

# The harness: CALLS short greedy chat calls through the session's proxy, PAUSE_S apart, each with the history so far.
AGENT = """
import json, os, time, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
for turn in range(int(os.environ["CALLS"])):
    body = {"model": os.environ["POLAR_MODEL"], "messages": messages, "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    answer = json.load(urllib.request.urlopen(request, timeout=300))
    messages += [{"role": "assistant", "content": answer["choices"][0]["message"].get("content") or ""},
                 {"role": "user", "content": "go on"}]
    time.sleep(float(os.environ["PAUSE_S"]))
print("done")
"""
SESSIONS = 4


def task(task_id: str, calls: int, pause_s: float) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": f"Say something about {task_id}.",
        "num_samples": SESSIONS,
        "timeout_seconds": 300,
        "agent": {
            "harness": "shell",
            "env": {"CALLS": str(calls), "PAUSE_S": str(pause_s)},
            "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
        },
        "builder": {"strategy": "per_request"},
    }


class Rollouts:
    """The trainer's side: tasks through the rollout server, completions from the gateway's journal."""

    def __init__(self, client: AsyncPolarClient, data_dir: Path) -> None:
        self.client = client
        self.data_dir = data_dir

    async def run(self, task_id: str, calls: int, pause_s: float = 0.0) -> dict[str, list[Completion]]:
        await self.client.submit(task(task_id, calls, pause_s))
        return await self.finish(task_id)

    async def finish(self, task_id: str) -> dict[str, list[Completion]]:
        """Wait for the task: every session completed, no error (the harness saw none); its completions."""
        status = await self.client.wait(task_id, timeout=300)
        assert status.state == "completed" and len(status.results) == SESSIONS, status
        for result in status.results:
            assert result.status == "completed" and result.error is None, result
        return await self.completions(task_id)

    async def completions(self, task_id: str) -> dict[str, list[Completion]]:
        """Session id → the completions journaled so far, for each session of ``task_id`` that has any."""
        sessions = (await self.client.status(task_id)).sessions
        journals = {sid: self.data_dir / "journal" / f"{sid}.jsonl" for sid in sessions}
        return {sid: calls for sid, path in journals.items() if path.exists() and (calls := read_journal(path))}


def replicas(by_session: dict[str, list[Completion]]) -> set[str | None]:
    return {c.replica for calls in by_session.values() for c in calls}


def test_sessions_spread_over_two_vllm_replicas_survive_a_kill_9_and_the_replica_comes_back(
    vllm_pair: tuple[VllmServer, VllmServer], tmp_path: Path
) -> None:
    a, b = vllm_pair
    data_dir = tmp_path / "polar-data"
    # group affinity off: the sessions of one task spread over both replicas, as the failover steps need
    pool = {"health_interval_s": 0.5, "group_affinity": False}
    topology = serve_config(tmp_path, "serve", gateway={"proxy": {"pool": pool}})
    serve = Serve(data_dir, "--port", "0", "--config", str(topology), "--backend", "vllm", "--backend-url", a.url,
                  "--backend-url", b.url, "--model", MODEL_NAME)  # fmt: skip

    async def body() -> None:
        info = await serve.ready()
        async with AsyncPolarClient(info["url"], info["token"], timeout=60) as client:
            rollouts = Rollouts(client, data_dir)

            # 1. sessions spread over both replicas, each session on one replica (its prefix cache)
            spread = await rollouts.run("spread", calls=3)
            assert replicas(spread) == {a.url, b.url}
            assert all(len({c.replica for c in calls}) == 1 and len(calls) == 3 for calls in spread.values())
            assert all(c.policy_version == 1 and c.token_source == "backend" for v in spread.values() for c in v)

            # 2. kill -9 of B while sessions sample on it: every session completes, B's own on A
            await client.submit(task("crash", calls=8, pause_s=0.3))

            async def on_b() -> bool:
                return b.url in replicas(await rollouts.completions("crash"))

            await until_true(on_b, "a completion on B", within=120)
            b.kill()
            b.start()  # restarting takes ~40 s: it overlaps the rest of the task
            crash = await rollouts.finish("crash")
            assert all(len(calls) == 8 for calls in crash.values())
            moved = [calls for calls in crash.values() if calls[0].replica == b.url]
            assert moved and all(calls[-1].replica == a.url for calls in moved)  # failed over, unknown to the harness

            # 3. removed and added back through the rollout server, B takes load again
            await client.remove_backend(b.url)
            [gateway] = (await client.inference()).gateways
            assert gateway.pool is not None and [r.url for r in gateway.pool.replicas] == [a.url]
            await asyncio.to_thread(b.wait_ready)
            [gateway] = (await client.add_backend(b.url)).gateways
            assert gateway.pool is not None and {(r.url, r.state) for r in gateway.pool.replicas} == {
                (a.url, "healthy"), (b.url, "healthy")}  # fmt: skip
            back = await rollouts.run("back", calls=2)
            assert replicas(back) == {a.url, b.url}

    try:
        asyncio.run(body())
    finally:
        serve.stop()
