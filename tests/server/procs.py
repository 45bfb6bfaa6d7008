"""Real ``polar serve`` processes on loopback for the service tests, a trainer callback receiver, and the task."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web

from tests.gateway.test_node import task

REPO = Path(__file__).resolve().parents[2]
FAST = {
    "server": {"heartbeat_interval_s": 0.3, "callbacks": {"initial_s": 0.1, "max_s": 0.5, "timeout_s": 5}},
    "agent": {"retry": {"initial_s": 0.1, "max_s": 0.5, "timeout_s": 5}},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_config(tmp_path: Path, name: str, **extra: Any) -> Path:
    """A topology file with fast heartbeats and retries (the tests exercise ``--config`` this way)."""
    data: dict[str, Any] = json.loads(json.dumps(FAST))
    data["gateway"] = {"scratch_root": str(tmp_path / "scratch"),
                       "pipeline": {"init_workers": 2, "run_slots": 3, "postrun_workers": 2}}  # fmt: skip
    for section, values in extra.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Serve:
    """One ``polar serve`` subprocess; ``info`` is its ``serve.json``; its stdout goes to ``serve.log``, its stderr to
    ``serve.err``. With ``default_data_dir`` it runs in the parent of ``data_dir`` (named ``polar-data``) without
    ``--data-dir``."""

    def __init__(self, data_dir: Path, *args: str, default_data_dir: bool = False) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.log = (data_dir / "serve.log").open("ab")
        self.err = (data_dir / "serve.err").open("ab")
        where = [] if default_data_dir else ["--data-dir", str(data_dir)]
        argv = [sys.executable, "-m", "polar_cli", "serve", *where, *args]
        cwd = data_dir.parent if default_data_dir else data_dir
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.err, env=env, cwd=cwd)
        self.info: dict[str, Any] = {}

    async def ready(self, within: float = 180.0) -> dict[str, Any]:
        path = self.data_dir / "serve.json"
        end = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"polar serve exited {self.proc.returncode}: {self.output()}")
            try:
                info = json.loads(path.read_text())
                if info.get("pid") == self.proc.pid:
                    self.info = info
                    return info
            except (OSError, ValueError):
                pass
            if time.monotonic() > end:
                raise AssertionError(f"polar serve did not start: {self.output()}")
            await asyncio.sleep(0.05)

    def output(self) -> str:
        return self.stdout()[-3000:] + self.stderr()[-3000:]

    def stdout(self) -> str:
        return (self.data_dir / "serve.log").read_text(errors="replace")

    def stderr(self) -> str:
        return (self.data_dir / "serve.err").read_text(errors="replace")

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.err.close()


def gateway(tmp_path: Path, name: str, server: dict[str, Any], config: Path, token: str) -> Serve:
    return Serve(tmp_path / name, "--role", "gateway", "--port", "0", "--config", str(config),
                 "--server", server["url"], "--server-token", server["token"], "--token", token)  # fmt: skip


def waiting_task(task_id: str, samples: int, marker: Path | None = None, **extra: Any) -> dict[str, Any]:
    """A shell-harness task whose agent (with ``marker``) waits until that file exists, then calls the proxy."""
    data = task(task_id, {}, num_samples=samples, **extra).model_dump(mode="json")
    if marker is not None:
        command = data["agent"]["config"]["command"]
        data["agent"]["config"]["command"] = f'while [ ! -e "{marker}" ]; do sleep 0.05; done; {command}'
    return data


def client(info: dict[str, Any], token: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token or info['token']}"}
    return httpx.AsyncClient(base_url=info["url"], headers=headers, timeout=60)


async def until_true(check: Any, what: str, within: float = 90.0) -> Any:
    """Poll the async ``check()`` until it returns something truthy."""
    end = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def gateway_metrics(url: str, token: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"{url}/metrics.json", headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        return dict(response.json())


class Receiver:
    """A trainer's callback listener: records every POST by its Idempotency-Key, and the keys it acknowledged in
    order. With ``refuse_first``, the first POST of each session result is answered 500 (to be sent again)."""

    def __init__(self, port: int, *, refuse_first: bool = False) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/callback"
        self.refuse_first = refuse_first
        self.by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.acknowledged: list[str] = []
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        self.by_key[key].append(await request.json())
        if self.refuse_first and key.startswith("session_result:") and len(self.by_key[key]) == 1:
            return web.json_response({"error": "not now"}, status=500)
        self.acknowledged.append(key)
        return web.json_response({"ok": True})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/callback", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
