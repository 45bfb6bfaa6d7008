"""A hostile local user against a gateway node and ``polar run``'s embedded gateway: without the control token
nothing is submitted, listed, read or cancelled; a task's script is never a host path; ids are checked in full."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode


def shell_task(task_id: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "instruction": "run", "timeout_seconds": 60,
            "agent": {"harness": "shell", "config": {"command": command}}, **extra}  # fmt: skip


def test_a_config_without_a_token_gets_a_generated_one(tmp_path: Path) -> None:
    first, second = GatewayConfig(), GatewayConfig(control_token=None)
    assert first.control_token and second.control_token and first.control_token != second.control_token
    assert GatewayConfig(control_token="t").proxy_config().control_token == "t"


def test_the_gateway_refuses_another_local_user(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    planted = shell_task("planted", f"touch {marker}")

    async def body() -> list[httpx.Response]:
        config = GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch")
        async with GatewayNode(config) as node:
            answers = []
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": node.config.control_token}):
                async with httpx.AsyncClient(base_url=node.url, headers=headers) as stranger:
                    answers += [
                        await stranger.post("/sessions", json={"task": planted}),
                        await stranger.get("/sessions/planted-0"),
                        await stranger.get("/sessions/planted-0/result"),
                        await stranger.delete("/sessions/planted-0"),
                        await stranger.get("/metrics"),
                        await stranger.get("/proxy/sessions"),
                        await stranger.post("/proxy/sessions", json={}),
                    ]
            await asyncio.sleep(0.5)  # had anything been submitted, it would have run by now
            assert node.pipeline.active() == [] and node.proxy.registry.sessions() == []
            async with httpx.AsyncClient(base_url=node.url) as stranger:
                health = await stranger.get("/healthz")
            assert health.status_code == 200 and health.json() == {"ok": True}
            return answers

    answers = asyncio.run(body())
    assert [a.status_code for a in answers] == [401] * len(answers), [a.text for a in answers]
    assert all(a.json()["error"]["type"] == "unauthorized" for a in answers)
    assert not marker.exists()


def test_a_task_script_is_never_a_host_path(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("- content: read from the host\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    async def body() -> list[httpx.Response]:
        config = GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch")
        async with GatewayNode(config) as node:
            headers = {"Authorization": f"Bearer {node.config.control_token}"}
            async with httpx.AsyncClient(base_url=node.url, headers=headers, timeout=20) as client:
                answers = [
                    await client.post("/sessions", json={"task": shell_task("t", "true", metadata={"script": path})})
                    for path in (str(script), str(fifo), "/etc/passwd")
                ]
            assert node.pipeline.active() == []
            return answers

    for answer in asyncio.run(body()):
        message = answer.json()["error"]["message"]
        assert answer.status_code == 400 and "metadata.script" in message and "inline list" in message, message
        assert "read from the host" not in message and "root:" not in message


def test_a_malformed_session_id_is_400_on_every_gateway_route(tmp_path: Path) -> None:
    async def body() -> list[httpx.Response]:
        config = GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch")
        async with GatewayNode(config) as node:
            headers = {"Authorization": f"Bearer {node.config.control_token}"}
            async with httpx.AsyncClient(base_url=node.url, headers=headers) as client:
                return [
                    await client.get("/sessions/abc%0A"),
                    await client.get("/sessions/abc%0A/result"),
                    await client.delete("/sessions/abc%0A"),
                    await client.get("/proxy/sessions/abc%0A"),
                    await client.post("/sessions", json={"task": shell_task("t", "true"), "session_id": "abc\n"}),
                    await client.post("/proxy/s/abc%0A/v1/chat/completions", json={}),
                ]

    answers = asyncio.run(body())
    assert [a.status_code for a in answers] == [400] * len(answers), [a.text for a in answers]


def test_polar_run_gateway_refuses_another_local_user(tmp_path: Path) -> None:
    release, marker = tmp_path / "release", tmp_path / "executed"
    task_file = tmp_path / "task.json"
    waiting = f"while [ ! -e {release} ]; do sleep 0.05; done"
    task_file.write_text(json.dumps(shell_task("waits", waiting, metadata={"script": []})))  # calls no model
    argv = [sys.executable, "-m", "polar_cli", "run", str(task_file), "--data-dir", str(tmp_path / "data"),
            "--no-install"]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200", "POLAR_LOAD_PLUGINS": ""}
    env.pop("POLAR_CONTROL_TOKEN", None)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stderr is not None
        seen = ""
        match = None
        while match is None:
            line = proc.stderr.readline()
            assert line, seen + (proc.stdout.read() if proc.stdout else "")
            seen += line
            match = re.search(r"gateway: (http://\S+)\s+\(control token: (\S+)\)", line)
        url, token = match.group(1), match.group(2)
        planted = {"task": shell_task("planted", f"touch {marker}")}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert httpx.post(f"{url}/sessions", json=planted, headers=headers).status_code == 401
            assert httpx.get(f"{url}/proxy/sessions", headers=headers).status_code == 401
            assert httpx.get(f"{url}/metrics", headers=headers).status_code == 401
        # the operator's token works: the agent is still running
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
        assert metrics.status_code == 200, metrics.text
        time.sleep(0.5)
        assert not marker.exists()
        release.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and "no_model_call" in out, out + err  # its agent never calls the model
    assert not marker.exists()
    assert len(list((tmp_path / "data" / "results").iterdir())) == 1  # the run's own session, nothing planted
