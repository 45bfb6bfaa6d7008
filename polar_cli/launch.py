"""``polar serve``: its topology (``ServeConfig``) and its lifecycle (``serve``): start the roles the config asks for,
announce where they are, run until cancelled.

- ``all``: the rollout server and one gateway node in one process (the gateway registers over loopback, exactly as a
  remote one does);
- ``server``: the rollout server alone;
- ``gateway``: one gateway node that registers with ``agent.server_url``.

Where each listens (and the tokens) goes to ``<data_dir>/serve.json`` (mode 0600) as well as to ``on_ready``. One
``polar serve`` per data dir: ``<data_dir>/serve.lock`` (:class:`DataDirLock`) refuses a second.

A stop (the task cancelled: SIGTERM, Ctrl-C) cancels the gateway's sessions under way; with ``drain_timeout_s`` it
first drains: no new sessions, up to that long for the ones under way to finish and be reported (a second stop
ends the wait).

It lives outside ``polar_cli.server`` and ``polar_cli.gateway`` because it starts both in one process (role ``all``)
and its config holds both configs: the one module that imports both packages, so neither imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from polar_cli import connect_file
from polar_cli.errors import ConfigError
from polar_cli.gateway.agent import Drained, GatewayAgent
from polar_cli.gateway.config import AgentConfig, GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import StrictModel
from polar_cli.server.app import create_app
from polar_cli.server.config import ServerConfig
from polar_cli.server.disk import SessionFiles
from polar_cli.server.service import RolloutServer
from polar_cli.web.listen import listen
from polar_cli.web.metrics import listen_metrics

INFO_FILE = "serve.json"
LOCK_FILE = "serve.lock"
Role = Literal["all", "server", "gateway"]


class MetricsBind(StrictModel):
    """A separate listener for ``GET /metrics`` (Prometheus text): no token, so an operator points Prometheus at it.
    Unset ``port``: none; ``/metrics`` is then served only behind each component's token. In role ``all`` it serves
    the server's and the gateway's metrics in one document (their names never clash)."""

    host: str = Field(default="127.0.0.1", description="where the metrics listener binds (it needs no token)")
    port: int | None = Field(default=None, ge=0, le=65535, description="its port (0: any free one); unset: none")


class ServeConfig(StrictModel):
    """``polar serve --config serve.yaml``: the role and the settings of each part (command-line flags win)."""

    role: Role = "all"
    drain_timeout_s: float = Field(
        default=0.0,
        ge=0.0,
        description="on a graceful stop, how long the gateway waits for sessions under way before cancelling them",
    )
    server: ServerConfig = Field(default_factory=ServerConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    metrics: MetricsBind = Field(default_factory=MetricsBind)
    connect_file: Path | None = Field(
        default=None,
        description="role server/all: write the server's URL and token here (mode 0600) once it listens; role "
        "gateway: wait for it (up to agent.register_timeout_s) and register with what it says (polar_cli.connect_file)",
    )


@dataclass
class ServeInfo:
    """What a started ``polar serve`` tells its operator."""

    role: str
    url: str | None = None
    """The rollout server's URL (``all``, ``server``)."""
    token: str | None = None
    """The server token (``all``, ``server``)."""
    gateway_url: str | None = None
    node_id: str | None = None
    node_token: str | None = None
    metrics_url: str | None = None
    """The separate metrics listener's ``/metrics`` (``metrics.port`` set), no token needed."""
    pid: int = 0


class DataDirLock:
    """``<data_dir>/serve.lock``, held with ``fcntl.flock`` for the life of a ``polar serve``: a second one on the same
    data dir (which would share its database and node id) is refused, naming the first's pid and URL. The kernel
    drops the lock when its process dies, however it died, so a killed server never blocks a restart."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(self.path)
            os.close(fd)
            raise ConfigError(
                f"data dir {data_dir} is in use by another polar serve ({holder}): stop it, or give this one its own "
                "--data-dir"
            ) from None
        self.fd = fd
        self.write({"pid": os.getpid()})

    def write(self, holder: dict[str, object]) -> None:
        """Say who holds the lock (read by a refused second server)."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder).encode(), 0)

    def release(self) -> None:
        os.close(self.fd)  # closing the descriptor drops the flock


def _holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not isinstance(holder, dict) or "pid" not in holder:
        return "still starting"
    where = ", ".join(str(holder[key]) for key in ("url", "gateway_url") if holder.get(key))
    return f"pid {holder['pid']}" + (f", {where}" if where else ", still starting")


async def serve(
    config: ServeConfig,
    on_ready: Callable[[ServeInfo], None] | None = None,
    *,
    on_drain: Callable[[int, float], None] | None = None,
    on_drained: Callable[[Drained], None] | None = None,
) -> None:
    """Run the configured roles until cancelled; everything started is stopped in reverse order. ``on_drain(sessions
    under way, drain_timeout_s)`` is called when a stop starts draining, ``on_drained`` with what the drain did."""
    info = ServeInfo(role=config.role, pid=os.getpid())
    agent_config = config.agent
    server: RolloutServer | None = None
    agent: GatewayAgent | None = None
    node: GatewayNode | None = None
    async with contextlib.AsyncExitStack() as stack:
        data_dirs = {config.server.data_dir} if config.role == "server" else {config.gateway.data_dir}
        if config.role == "all":
            data_dirs.add(config.server.data_dir)
        locks = [DataDirLock(path) for path in sorted({path.resolve() for path in data_dirs})]
        for lock in locks:
            stack.callback(lock.release)
        if config.role in ("all", "server"):
            files = None
            if config.role == "all":  # the embedded gateway's per-session files: retention measures and removes them
                files = SessionFiles(config.gateway.results_dir, config.gateway.journal_dir)
            server = await stack.enter_async_context(RolloutServer(config.server, session_files=files))
            listener = await listen(create_app(server), config.server.host, config.server.port)
            stack.push_async_callback(listener.close)
            info.url, info.token = listener.url, server.token
            if config.connect_file is not None:
                url = connect_file.advertised_url(config.server.host, listener.port, config.server.public_url)
                connect_file.write(config.connect_file, connect_file.ServerAddress(url=url, token=server.token))
            if config.role == "all":
                agent_config = agent_config.model_copy(update={"server_url": info.url, "server_token": server.token})
        if config.role == "gateway" and config.connect_file is not None:
            found = await connect_file.wait_for(config.connect_file, agent_config.register_timeout_s)
            agent_config = agent_config.model_copy(  # what the command line or config gave wins
                update={
                    "server_url": agent_config.server_url or found.url,
                    "server_token": agent_config.server_token or found.token,
                }
            )
        if config.role in ("all", "gateway"):
            agent = GatewayAgent(agent_config, config.gateway.data_dir)
            node = GatewayNode(config.gateway, on_result=[agent.on_result], node_id=agent.node_id)
            await stack.enter_async_context(node)
            await agent.start(node)
            stack.push_async_callback(agent.close)
            info.gateway_url, info.node_token = node.url, config.gateway.control_token
            await agent.ready()  # the server's refusal, or its URL unreachable for agent.register_timeout_s, stops here
            info.node_id = agent.node_id
        if config.metrics.port is not None:
            sources = [part.exposition for part in (server, node) if part is not None]
            metrics = await listen_metrics(sources, config.metrics.host, config.metrics.port)
            stack.push_async_callback(metrics.close)
            info.metrics_url = f"{metrics.url}/metrics"
        data_dir = config.gateway.data_dir if config.role == "gateway" else config.server.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        connect_file.write_private(data_dir / INFO_FILE, json.dumps(asdict(info)))
        for lock in locks:
            lock.write({"pid": info.pid, "url": info.url, "gateway_url": info.gateway_url})
        if on_ready is not None:
            on_ready(info)
        try:
            await (agent.run() if agent is not None else asyncio.Event().wait())  # raises if the server refuses it
        except asyncio.CancelledError:
            if agent is None or config.drain_timeout_s <= 0:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # this stop is handled by draining; another one cancels the drain
            if server is not None:
                server.stop_dispatching()
            if on_drain is not None and node is not None:
                on_drain(len(node.pipeline.active()), config.drain_timeout_s)
            drained = await agent.drain(config.drain_timeout_s)
            if on_drained is not None:
                on_drained(drained)
            raise
