"""Every kind of server Polar starts, real and on loopback port 0, for the web layer's tests: the proxy, a gateway
node and the rollout server, each served by ``polar_cli.web.listen.listen`` on one background event loop.

``served`` is a :class:`Served` per kind (module-scoped): its URL, its control token, the route that creates
something and a valid body for it, and the listing routes that must keep answering 200.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.gateway.node import GatewayConfig, GatewayNode
from polar_cli.proxy.app import create_proxy_app
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.state import ProxyState
from polar_cli.server.app import create_app
from polar_cli.server.config import ServerConfig
from polar_cli.server.service import RolloutServer
from polar_cli.web.listen import listen
from tests.proxy.conftest import LoopThread

KINDS = ["proxy", "gateway", "server"]


def shell_task(task_id: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"task_id": task_id, "instruction": "run", "timeout_seconds": 60, "metadata": metadata or {},
            "agent": {"harness": "shell", "config": {"command": "true"}}}  # fmt: skip


def depth_of(value: Any) -> int:
    """How many arrays/objects deep ``value`` nests (a scalar is 0, ``{}`` is 1)."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def _containers_around(value: Any, leaf: str) -> int:
    """How many arrays/objects enclose the string ``leaf`` in ``value`` (-1: it is not there)."""
    if value == leaf:
        return 0
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    found = [_containers_around(child, leaf) for child in children]
    return max((1 + n for n in found if n >= 0), default=-1)


@dataclass
class Served:
    """One running server of a kind, and how to talk to it."""

    kind: str
    url: str
    token: str
    create: str
    """The POST route that creates something (a session, a task)."""
    make_body: Callable[[str, dict[str, Any]], dict[str, Any]]
    """``(id, metadata) -> a valid body for create``."""
    listings: list[str]
    """GET routes that list what exists: they must always answer 200."""
    count: Callable[[httpx.Client], int]
    """How many things exist (sessions, tasks), read over HTTP."""
    read_one: Callable[[str], str]
    """The GET route of one created thing, by id."""
    created_id: Callable[[httpx.Response], str] = field(default=lambda resp: str(resp.json()["session_id"]))

    def client(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {self.token}", **headers})

    def body_of_depth(self, thing_id: str, depth: int) -> bytes:
        """A valid create body whose metadata makes the whole body exactly ``depth`` arrays/objects deep."""
        template = self.make_body(thing_id, {"deep": "@deep@"})
        levels = depth - _containers_around(template, "@deep@")  # written by hand: json cannot write 1000 levels
        raw = json.dumps(template).replace('"@deep@"', "[" * levels + '"x"' + "]" * levels).encode()
        if levels < 200:
            assert depth_of(json.loads(raw)) == depth
        return raw


def _proxy_count(client: httpx.Client) -> int:
    return len(client.get("/sessions").json()["sessions"])


def _gateway_count(client: httpx.Client) -> int:
    return int(client.get("/metrics.json").json()["sessions"]["submitted"])


def _server_count(client: httpx.Client) -> int:
    return sum(client.get("/rollout/status").json()["tasks"].values())


async def _start(kind: str, root: Path, stack: AsyncExitStack) -> Served:
    if kind == "proxy":
        config = ProxyConfig(backend="scripted", journal_dir=root / "journal")
        state = ProxyState(config)
        listener = await listen(create_proxy_app(config, state), "127.0.0.1", 0)
        stack.push_async_callback(listener.close)
        state.base_url = listener.url
        return Served(kind, listener.url, config.control_token, "/sessions",
                      lambda sid, metadata: {"session_id": sid, "metadata": metadata},
                      ["/sessions"], _proxy_count, lambda sid: f"/sessions/{sid}")  # fmt: skip
    if kind == "gateway":
        gateway = GatewayConfig(port=0, data_dir=root / "data", scratch_root=root / "scratch")
        node = await stack.enter_async_context(GatewayNode(gateway))
        assert node.url is not None
        return Served(kind, node.url, gateway.control_token, "/sessions",
                      lambda sid, metadata: {"task": shell_task(sid, metadata), "session_id": sid},
                      ["/metrics.json", "/proxy/sessions"], _gateway_count, lambda sid: f"/sessions/{sid}")  # fmt: skip
    server = await stack.enter_async_context(RolloutServer(ServerConfig(port=0, data_dir=root / "data", token="t")))
    listener = await listen(create_app(server), "127.0.0.1", 0)
    stack.push_async_callback(listener.close)
    return Served(kind, listener.url, "t", "/rollout/task/submit", shell_task, ["/rollout/status"], _server_count,
                  lambda tid: f"/rollout/task/{tid}", lambda resp: str(resp.json()["task_id"]))  # fmt: skip


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    loop_thread = LoopThread()
    stack = AsyncExitStack()
    try:
        yield loop_thread.run(_start(request.param, tmp_path_factory.mktemp(request.param), stack))
    finally:
        loop_thread.run(stack.aclose())
        loop_thread.close()
