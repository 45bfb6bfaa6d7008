"""Polar on a Ray cluster (the ``[ray]`` extra; docs/deploy.md, "Ray"): the gateways placed as Ray actors, and
optionally the rollout server as a detached one. Ray is imported when one of these is called, never when this module
is imported, and no other module of ``polar_cli`` imports this one (veRL's agent loop imports Ray on its own).

- :meth:`Fleet.start` places ``gateways_per_node`` gateway actors on every alive node, or on the nodes whose labels
  match ``node_labels`` and whose resources hold ``gateway_resources`` (each actor reserves them), pinned there with
  a hard node affinity. A watcher thread in the driver puts gateways on nodes that join; a node that leaves takes its
  gateways with it, and the server re-dispatches their sessions as for any dead node. ``fleet.client()`` is an
  ``AsyncPolarClient`` of the server, for a trainer driver on the same cluster.
- Each actor runs one ``polar serve --role gateway`` as a subprocess on its node (its own event loop, its own
  signals): it binds a free port on every interface, registers ``http://<node IP>:<port>`` with the server and tells
  it its Ray node id and IP (its node row's placement). The server token reaches it in the environment, never on a
  command line. Its data dir is ``<data_root>/<Ray node id>-<index>`` on its node, so an actor Ray restarts there
  (the gateway process died: ``max_restarts``) rejoins as the same node and reports the results it held.
- Stopping an actor drains its gateway exactly as SIGTERM does (``polar serve --drain-timeout``): :meth:`Fleet.shutdown`
  sends SIGTERM and waits for the drain; an actor killed outright (``ray.kill``, its driver gone, its worker lost)
  takes its gateway with it by the same SIGTERM (the kernel's parent-death signal).
- :func:`start_server` runs ``polar serve --role server`` in a detached named actor with its state in the data dir
  the user gives (on the node the actor lands on: pin it with ``resources``), or finds the one already running.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import Field

from polar_cli import connect_file
from polar_cli.client import AsyncPolarClient
from polar_cli.connect_file import ServerAddress
from polar_cli.errors import ConfigError, PolarError
from polar_cli.extras import require
from polar_cli.gateway.placement import RAY_NODE_ID_ENV, RAY_NODE_IP_ENV
from polar_cli.launch import INFO_FILE, DataDirLock
from polar_cli.models import StrictModel, validate_model

log = logging.getLogger(__name__)

LOG_FILE = "ray-actor.log"
"""The subprocess's stdout and stderr, in its data dir."""
SERVER_NAME = "polar-server"
NAMESPACE = "polar"
STOP_MARGIN_S = 30.0
"""How much longer than the drain a stop waits for the process before killing it (the hand-back, the exit)."""
_PR_SET_PDEATHSIG = 1


class FleetConfig(StrictModel):
    """The options of :meth:`Fleet.start`."""

    gateways_per_node: int = Field(default=1, ge=1, description="gateway actors on each chosen node")
    gateway_resources: dict[str, float] = Field(
        default_factory=dict,
        description="what each gateway actor reserves (CPU, GPU, memory, custom resources); nodes that cannot hold "
        "gateways_per_node of them get none. Empty: nothing reserved, every node qualifies",
    )
    node_labels: dict[str, str] = Field(default_factory=dict, description="only nodes with these Ray labels")
    runtime: dict[str, Any] | None = Field(
        default=None,
        description="Ray's runtime_env of the gateway actors (env_vars, a py_executable with the harness CLIs...); "
        "the sandbox runtime of each session stays the task's runtime.backend",
    )
    gateway_args: list[str] = Field(
        default_factory=list, description="more `polar serve` options: --backend, --backend-url, --config, --run-slots"
    )
    data_root: Path = Field(
        default=Path("/tmp/polar-ray"),
        description="node-local root of the gateways' data dirs (<root>/<Ray node id>-<index>)",
    )
    drain_timeout_s: float = Field(
        default=60.0, ge=0, description="a stopping gateway waits this long for its sessions before handing them back"
    )
    max_restarts: int = Field(default=-1, ge=-1, description="Ray restarts of a gateway actor whose process died")
    watch_interval_s: float = Field(default=2.0, gt=0, description="how often the driver looks for joined nodes")
    ready_timeout_s: float = Field(default=120.0, gt=0, description="how long a gateway may take to register")


class RayServer(StrictModel):
    """The rollout server as a detached Ray actor (:func:`start_server`)."""

    data_dir: Path = Field(description="the server's state (server.db), on the node the actor runs on")
    name: str = Field(default=SERVER_NAME, description="the actor's name (one server per name and namespace)")
    namespace: str = NAMESPACE
    port: int = Field(default=0, ge=0, le=65535, description="0: any free one")
    args: list[str] = Field(default_factory=list, description="more `polar serve` options, e.g. --config")
    resources: dict[str, float] = Field(default_factory=dict, description="what the actor reserves (pins its node)")
    ready_timeout_s: float = Field(default=120.0, gt=0)


@dataclass(frozen=True)
class GatewayInfo:
    """One gateway actor, as it reports itself."""

    ray_node_id: str
    node_ip: str
    index: int
    node_id: str
    """Its node id at the rollout server."""
    url: str
    data_dir: Path
    pid: int
    """The ``polar serve`` process."""


def _ray() -> ModuleType:
    return require("ray", needed_by="polar_cli.ray")


@functools.cache
def _remote(actor: type) -> Any:
    """``ray.remote(actor)``, made once per process (each one exports the class to the cluster again)."""
    return _ray().remote(actor)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The child gets SIGTERM (and drains) when the actor's process dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Serve:
    """One ``polar serve`` subprocess of an actor: started once its data dir is free (a previous incarnation may still
    be draining), ready once it wrote ``serve.json``. Its unexpected exit ends the actor's process, so Ray restarts
    the actor (``max_restarts``)."""

    def __init__(self, argv: list[str], data_dir: Path, env: dict[str, str], within: float) -> None:
        self.data_dir = data_dir
        _wait_for_data_dir(data_dir, within)
        with (data_dir / LOG_FILE).open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.stopping = False
        self.info = self._ready(within)
        threading.Thread(target=self._watch, daemon=True, name="polar-serve-watch").start()

    def _ready(self, within: float) -> dict[str, Any]:
        end = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                raise PolarError(self.said() or f"polar serve exited {self.proc.returncode}")
            with contextlib.suppress(OSError, ValueError):
                info = _read_json(self.data_dir / INFO_FILE)
                if info.get("pid") == self.proc.pid:
                    return info
            if time.monotonic() > end:
                self.stop(0)
                raise PolarError(f"polar serve did not start within {within:g} s: {self.said()}")
            time.sleep(0.1)

    def said(self) -> str:
        """Its error line (``Error: ...``, without the prefix), else its last line."""
        lines = [line for line in self.log().splitlines() if line.strip()]
        errors = [line.removeprefix("Error:").strip() for line in lines if line.startswith("Error:")]
        return (errors or lines or [""])[-1]

    def log(self) -> str:
        return (self.data_dir / LOG_FILE).read_text(errors="replace")

    def _watch(self) -> None:
        code = self.proc.wait()
        if not self.stopping:
            print(f"polar serve exited {code}: {self.said()}; the actor exits for Ray to restart it", file=sys.stderr)
            os._exit(1)

    def stop(self, drain_s: float) -> str:
        """SIGTERM (the drain), then what the drain said (``Draining: ...``, ``Drained: ...``)."""
        self.stopping = True
        start = len(self.log())
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(drain_s + STOP_MARGIN_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return "\n".join(line for line in self.log()[start:].splitlines() if line.startswith(("Draining", "Drained")))


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _wait_for_data_dir(data_dir: Path, within: float) -> None:
    """Until no ``polar serve`` holds ``data_dir`` (a killed actor's gateway drains before it lets go)."""
    end = time.monotonic() + within
    while True:
        try:
            DataDirLock(data_dir).release()
            return
        except ConfigError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def _child_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "POLAR_TOKEN"}  # a server token is no node's
    return {**env, **extra}


class GatewayActor:
    """A gateway on one Ray node (``ray.remote`` is applied by :class:`Fleet`, so this module imports without Ray).
    A failure to start is kept and raised by :meth:`info`, as one line: the actor is not restarted for it."""

    def __init__(self, config: FleetConfig, server: ServerAddress, index: int) -> None:
        ray = _ray()
        self.ray_node_id = str(ray.get_runtime_context().get_node_id())
        self.node_ip = str(ray.util.get_node_ip_address())
        self.index = index
        self.config = config
        data_dir = config.data_root / f"{self.ray_node_id}-{index}"
        argv = [sys.executable, "-m", "polar_cli", "serve", "--role", "gateway", "--host", "0.0.0.0",
                "--public-url", f"http://{self.node_ip}", "--data-dir", str(data_dir), "--server", server.url,
                "--drain-timeout", f"{config.drain_timeout_s:g}", *config.gateway_args]  # fmt: skip
        env = _child_env({"POLAR_SERVER_TOKEN": server.token, RAY_NODE_ID_ENV: self.ray_node_id,
                          RAY_NODE_IP_ENV: self.node_ip})  # fmt: skip
        self.error: str | None = None
        self.serve: _Serve | None = None
        try:
            self.serve = _Serve(argv, data_dir, env, config.ready_timeout_s)
        except PolarError as exc:
            self.error = f"the gateway on Ray node {self.ray_node_id} ({self.node_ip}): {exc}"

    def info(self) -> GatewayInfo:
        if self.serve is None:
            raise PolarError(self.error or "the gateway did not start")
        info = self.serve.info
        return GatewayInfo(ray_node_id=self.ray_node_id, node_ip=self.node_ip, index=self.index,
                           node_id=str(info["node_id"]), url=str(info["gateway_url"]), data_dir=self.serve.data_dir,
                           pid=self.serve.proc.pid)  # fmt: skip

    def stop(self) -> str:
        """Drain the gateway (as SIGTERM does) and say what it did."""
        return "" if self.serve is None else self.serve.stop(self.config.drain_timeout_s)


class ServerActor:
    """The rollout server in a detached actor (:func:`start_server`)."""

    def __init__(self, spec: RayServer) -> None:
        ray = _ray()
        ip = str(ray.util.get_node_ip_address())
        connect = spec.data_dir / "connect.json"
        argv = [sys.executable, "-m", "polar_cli", "serve", "--role", "server", "--host", "0.0.0.0",
                "--port", str(spec.port), "--public-url", f"http://{ip}", "--data-dir", str(spec.data_dir),
                "--connect-file", str(connect), *spec.args]  # fmt: skip
        self.error: str | None = None
        self.serve: _Serve | None = None
        self._address: ServerAddress | None = None
        try:
            self.serve = _Serve(argv, spec.data_dir, _child_env({}), spec.ready_timeout_s)
            self._address = connect_file.read(connect)
        except PolarError as exc:
            self.error = f"the rollout server on Ray node {ip}: {exc}"

    def address(self) -> ServerAddress:
        if self._address is None:
            raise PolarError(self.error or "the rollout server did not start")
        return self._address

    def stop(self) -> str:
        return "" if self.serve is None else self.serve.stop(0)


def _one_line(exc: Exception) -> PolarError:
    """A PolarError raised in an actor, as itself; any other Ray failure as one line."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, PolarError):
        return cause
    first = str(exc).strip().splitlines()
    return PolarError(f"{type(exc).__name__}: {first[0] if first else ''}")


def start_server(spec: RayServer) -> ServerAddress:
    """Start the rollout server as a detached actor named ``spec.name``, or find the one running; its address."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init()
    actor = _remote(ServerActor).options(
        name=spec.name, namespace=spec.namespace, lifetime="detached", get_if_exists=True, num_cpus=0,
        resources=spec.resources or None, max_restarts=-1,
    ).remote(spec)  # fmt: skip
    try:
        address: ServerAddress = ray.get(actor.address.remote(), timeout=spec.ready_timeout_s + STOP_MARGIN_S)
    except ray.exceptions.RayError as exc:
        raise _one_line(exc) from exc
    return address


def stop_server(name: str = SERVER_NAME, namespace: str = NAMESPACE) -> None:
    """Stop the detached server actor (its state stays in its data dir: :func:`start_server` again resumes it)."""
    ray = _ray()
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return
    with contextlib.suppress(ray.exceptions.RayError):
        ray.get(actor.stop.remote(), timeout=STOP_MARGIN_S * 2)
    ray.kill(actor, no_restart=True)


def eligible(node: Mapping[str, Any], config: FleetConfig) -> bool:
    """Whether a node of ``ray.nodes()`` gets gateways: alive, with the labels asked for, and room for them."""
    if not node.get("Alive"):
        return False
    labels = node.get("Labels") or {}
    if any(labels.get(key) != value for key, value in config.node_labels.items()):
        return False
    have = node.get("Resources") or {}
    wanted = config.gateway_resources.items()
    return all(have.get(key, 0.0) >= amount * config.gateways_per_node for key, amount in wanted)


def actor_options(config: FleetConfig) -> dict[str, Any]:
    """``gateway_resources`` as Ray's actor options."""
    named = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": config.max_restarts}
    custom = {key: amount for key, amount in config.gateway_resources.items() if key not in named}
    options.update({named[key]: amount for key, amount in config.gateway_resources.items() if key in named})
    if custom:
        options["resources"] = custom
    if config.runtime is not None:
        options["runtime_env"] = config.runtime
    return options


class Fleet:
    """Gateway actors on the nodes of a Ray cluster, kept there by a watcher thread until :meth:`shutdown`."""

    def __init__(self, ray: ModuleType, config: FleetConfig, server: ServerAddress) -> None:
        self._ray = ray
        self.config = config
        self.server = server
        self._actors: dict[str, list[Any]] = {}
        """Ray node id -> its gateway actors."""
        self._failed: dict[str, str] = {}
        """Ray node id -> why its gateways did not start (not tried again)."""
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def start(cls, server: ServerAddress | RayServer | Path, **options: Any) -> Fleet:
        """Place the gateways (``options``: :class:`FleetConfig`) and wait until each has registered with ``server``
        (its address, a connect file, or a :class:`RayServer` to start or find). A gateway that cannot start fails
        this with one line naming its node and the cause."""
        config = validate_model(FleetConfig, options, source="Fleet.start")
        ray = _ray()
        if not ray.is_initialized():
            ray.init()
        fleet = cls(ray, config, _address(server))
        fleet.sync(wait=True)
        if fleet._failed:
            fleet.shutdown()
            raise PolarError(next(iter(fleet._failed.values())))
        fleet._watcher = threading.Thread(target=fleet._watch, daemon=True, name="polar-fleet-watch")
        fleet._watcher.start()
        return fleet

    def sync(self, *, wait: bool = False) -> None:
        """Put gateways on the eligible nodes that have none; forget the gateways of nodes that left. With ``wait``,
        until the new ones have registered (or failed)."""
        ray = self._ray
        nodes = {str(node["NodeID"]): node for node in ray.nodes() if eligible(node, self.config)}
        strategies = require("ray.util.scheduling_strategies", needed_by="polar_cli.ray")
        started: dict[str, list[Any]] = {}
        with self._lock:
            for gone in set(self._actors) - set(nodes):
                log.warning("Ray node %s left: its gateways went with it", gone)
                del self._actors[gone]
            for node_id in set(nodes) - set(self._actors) - set(self._failed):
                strategy = strategies.NodeAffinitySchedulingStrategy(node_id, soft=False)
                actor = _remote(GatewayActor).options(scheduling_strategy=strategy, **actor_options(self.config))
                started[node_id] = [actor.remote(self.config, self.server, index)
                                    for index in range(self.config.gateways_per_node)]  # fmt: skip
                self._actors[node_id] = started[node_id]
        if not wait:
            return
        within = self.config.ready_timeout_s + STOP_MARGIN_S
        for node_id, actors in started.items():
            try:
                ray.get([actor.info.remote() for actor in actors], timeout=within)
            except ray.exceptions.RayError as exc:
                self._failed[node_id] = str(_one_line(exc))
                with self._lock:
                    for actor in self._actors.pop(node_id, []):
                        ray.kill(actor, no_restart=True)

    def _watch(self) -> None:
        while not self._stopped.wait(self.config.watch_interval_s):
            try:
                self.sync(wait=True)
            except Exception:  # the watcher outlives a bad poll (a GCS hiccup): it says so and tries again
                log.exception("the Polar fleet's watcher could not look at the Ray nodes")
            for node_id, why in list(self._failed.items()):
                log.error("no gateway on Ray node %s: %s", node_id, why)

    def gateways(self, timeout: float = 30.0) -> list[GatewayInfo]:
        """The gateways up now (those of nodes that left, or still starting, are not listed)."""
        with self._lock:
            actors = [actor for group in self._actors.values() for actor in group]
        found = []
        for actor in actors:
            with contextlib.suppress(self._ray.exceptions.RayError):
                found.append(self._ray.get(actor.info.remote(), timeout=timeout))
        return found

    def client(self, *, timeout: float = 30.0) -> AsyncPolarClient:
        """A client of the rollout server the gateways registered with."""
        return AsyncPolarClient(self.server.url, self.server.token, timeout=timeout)

    def shutdown(self) -> list[str]:
        """Stop watching, drain every gateway (as SIGTERM does: sessions under way finish within ``drain_timeout_s``
        or go back to the server) and end the actors; what each drain said."""
        ray = self._ray
        self._stopped.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            actors = [actor for group in self._actors.values() for actor in group]
            self._actors.clear()
        said = []
        stops = [actor.stop.remote() for actor in actors]
        for ref in stops:
            with contextlib.suppress(ray.exceptions.RayError):
                said.append(ray.get(ref, timeout=self.config.drain_timeout_s + STOP_MARGIN_S * 2))
        for actor in actors:
            ray.kill(actor, no_restart=True)
        return said

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _address(server: ServerAddress | RayServer | Path) -> ServerAddress:
    if isinstance(server, ServerAddress):
        return server
    if isinstance(server, RayServer):
        return start_server(server)
    found = connect_file.read(Path(server))
    if found is None:
        raise ConfigError(f"no rollout server wrote the connect file {server}")
    return found
