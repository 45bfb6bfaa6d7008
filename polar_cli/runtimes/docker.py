"""The ``docker`` runtime: one container per session through the ``docker`` package (Docker Engine API).

The container runs ``config.command`` (default ``sleep infinity`` under docker's init), labelled
``polar.session=<id>``, ``polar.runtime=docker``, ``polar.node=<node id>``, ``polar.owner=<host>:<pid>``,
``polar.owner_started=<ticks>`` and ``polar.scratch=<dir>`` so that :meth:`DockerRuntime.leftovers` finds it again
(``polar_cli.runtimes.gc`` decides what goes). Network mode defaults to ``host`` so commands reach a gateway on
127.0.0.1. Short commands go through the container's exec server (``exec_server.py``: one ``docker exec`` per
sandbox); the harness (``long_running``), and every command where the server cannot run, is a ``docker exec`` of its
own. Stop removes the container and the session's host directories.
Blocking client calls run in a thread. ``config``: ``pull`` (missing|never|always, default missing), ``user``,
``init`` (default true), ``command`` (argv of the keep-alive process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from polar_cli.aio import wait_event
from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import (
    HOME_PATH,
    KILL_GRACE_SECONDS,
    RUN_PATH,
    SESSION_PATH,
    TOOLS_PATH,
    ExecResult,
    Leftover,
    Owner,
    RuntimeContext,
    RuntimeProcess,
    Stream,
)
from polar_cli.models import StrictModel
from polar_cli.models.task import RuntimeSpec
from polar_cli.runtimes.checkpoint import APPLY_SCRIPT, KILL_NEW_SCRIPT, PIDS_SCRIPT, ROOTFS_MARKER, rootfs_plan, shown
from polar_cli.runtimes.container import (
    KILL_SCRIPT,
    ContainerHandle,
    ContainerRuntime,
    open_dirs_for_container_users,
    read_pid,
)
from polar_cli.runtimes.exec_server import SERVER_SCRIPT, ExecServer, await_ready, serves
from polar_cli.runtimes.files import write_bytes
from polar_cli.runtimes.process import OutputQueue
from polar_cli.runtimes.scratch import Scratch, remove_tree, this_process

LABEL_SESSION = "polar.session"
LABEL_RUNTIME = "polar.runtime"
LABEL_OWNER = "polar.owner"
LABEL_SCRATCH = "polar.scratch"
LABEL_NODE = "polar.node"
LABEL_OWNER_STARTED = "polar.owner_started"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVER_START_SECONDS = 60.0
WAIT_POLL_FIRST, WAIT_POLL_MAX = 0.1, 1.0  # seconds between engine asks while an engine exec's output stays open
T = TypeVar("T")


class DockerOptions(StrictModel):
    """``RuntimeSpec.config`` of ``docker``."""

    model_config = ConfigDict(coerce_numbers_to_str=True)  # user: 1000

    pull: Literal["missing", "never", "always"] = Field(default="missing", description="when to pull the image")
    user: str | None = Field(default=None, description="the container's user (name, uid or uid:gid)")
    init: bool = Field(default=True, description="run docker's init as PID 1")
    command: list[str] | None = Field(default=None, description="argv of the keep-alive process")


def docker_client() -> Any:
    """A client for the engine named by the environment (DOCKER_HOST, ...); RuntimeFailure when none answers."""
    try:
        import docker
    except ImportError as exc:
        raise RuntimeFailure("the docker runtime needs the 'docker' package: pip install 'polar-rl[docker]'") from exc
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if where.startswith("unix://"):
        # docker-py leaks its socket when a unix connect fails; try the socket ourselves first
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(10)
                probe.connect(where.removeprefix("unix://"))
        except OSError as exc:
            raise RuntimeFailure(f"no Docker Engine answers at {where}: {exc} (see docs/runtimes.md)") from exc
    client = None
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # docker.errors.DockerException, requests errors, OSError: all mean "no engine"
        if client is not None:
            client.close()
        raise RuntimeFailure(f"no Docker Engine answers at {where}: {exc} (see docs/runtimes.md)") from exc
    return client


async def call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking docker call in a thread; its errors become RuntimeFailure."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except RuntimeFailure:
        raise
    except Exception as exc:  # every docker/requests error at this boundary
        raise RuntimeFailure(f"docker: {what} failed: {exc}") from exc


def _is_not_found(exc: BaseException) -> bool:
    from docker.errors import NotFound

    return isinstance(exc.__cause__ or exc, NotFound)


def pump_stream(sock: Any, emit: Callable[[Stream | None, bytes], None], name: str) -> None:
    """Read an exec's multiplexed stream in a thread of its own: ``emit(stream, chunk)`` per chunk, then
    ``emit(None, b"")`` once it ends (the exec ended, or its container went away); the socket is closed after."""
    from docker.utils.socket import demux_adaptor, frames_iter

    raw = getattr(sock, "_sock", sock)
    raw.settimeout(None)  # the client's 60 s read timeout must not cut off a quiet command

    def run() -> None:
        try:
            for frame in frames_iter(sock, False):
                out, err = demux_adaptor(*frame)
                if out:
                    emit("stdout", out)
                if err:
                    emit("stderr", err)
        except Exception:  # the container went away mid-stream: the output simply ends
            pass
        finally:
            with contextlib.suppress(Exception):
                response = getattr(sock, "_response", None)
                if response is not None:
                    response.close()
                sock.close()
                raw.close()
            emit(None, b"")

    threading.Thread(target=run, name=name, daemon=True).start()


class DockerProcess(RuntimeProcess):
    """One ``docker exec``: output streamed from a thread, exit polled, group killed from inside."""

    def __init__(self, handle: DockerHandle, exec_id: str, pid_file: Path) -> None:
        self._handle = handle
        self._api = handle.client.api
        self._exec_id = exec_id
        self._pid_file = pid_file
        self._queue = OutputQueue(1)
        self._exit_code: int | None = None
        self._loop = asyncio.get_running_loop()
        self._eof = asyncio.Event()  # output ended: the command has most likely just exited

    def pump(self, sock: Any) -> None:
        """Forward the exec's output (from a thread that lives as long as the command), then end it."""
        pump_stream(sock, self._emit, f"polar-docker-exec-{self._exec_id[:12]}")

    def _emit(self, stream: Stream | None, chunk: bytes) -> None:
        def put() -> None:
            if stream is None:
                self._queue.close()
                self._eof.set()
            else:
                self._queue.put(stream, chunk)

        with contextlib.suppress(RuntimeError):  # loop closed: nobody listens any more
            self._loop.call_soon_threadsafe(put)

    def output(self) -> AsyncIterator[tuple[Stream, bytes]]:
        return self._queue.__aiter__()

    async def _inspect(self) -> dict[str, Any]:
        return await call("exec inspect", self._api.exec_inspect, self._exec_id)

    @staticmethod
    def _exited(info: Mapping[str, Any]) -> bool:
        """Whether the exec has run and ended. ``exec start`` hands back the stream before the engine starts the
        process: until then it reads ``Running: false`` with no ``ExitCode``, which is "not yet", never "exited"."""
        return not info.get("Running") and info.get("ExitCode") is not None

    async def wait(self) -> int:
        """Wake when the output ends (the command has most likely just exited) and ask the engine once. A background
        child can hold the output open after the command exited: until it ends, ask at a slowing pace (each ask is
        an engine call, and a harness runs for minutes)."""
        delay = WAIT_POLL_FIRST
        while self._exit_code is None:
            if not self._eof.is_set():
                await wait_event(self._eof, delay)
                delay = min(delay * 2, WAIT_POLL_MAX)
            try:
                info = await self._inspect()
            except RuntimeFailure as exc:
                if _is_not_found(exc) or self._handle.closed:
                    self._exit_code = 137  # the container was removed under it
                    break
                raise
            if self._exited(info):
                self._exit_code = int(info["ExitCode"])
                break
            if not info.get("Running") and self._eof.is_set() and not await self._handle.container_running():
                self._exit_code = 137  # its container died before the command could start
                break
            if self._eof.is_set():
                await asyncio.sleep(0.01)  # the engine records the exit a moment after the stream ends
        return self._exit_code

    async def terminate(self, grace: float = KILL_GRACE_SECONDS) -> None:
        if self._handle.closed or self._exit_code is not None:
            return
        pid = read_pid(self._pid_file)
        for _ in range(40):  # the wrapper writes its pid first thing (once the engine started it); give it a moment
            if pid is not None or self._exited(await self._inspect()):
                break
            await asyncio.sleep(0.05)
            pid = read_pid(self._pid_file)
        if pid is None:
            return
        for sig, wait_for in (("TERM", grace), ("KILL", 0.0)):
            if sig == "TERM" and grace <= 0:
                continue
            await self._handle.kill_in_container(sig, pid)
            deadline = time.monotonic() + wait_for
            while time.monotonic() < deadline:
                if self._exited(await self._inspect()):
                    return
                await asyncio.sleep(0.05)


class DockerHandle(ContainerHandle):
    def __init__(self, scratch: Scratch, context: RuntimeContext, client: Any, workdir: str) -> None:
        super().__init__(scratch, context)
        self.client = client
        self.container: Any = None
        self.workdir = workdir
        self.image_id = ""
        self._server: ExecServer | None = None
        self._server_lock = asyncio.Lock()
        self._server_failure: str | None = None
        self._checkpoint_pids = ""
        self._checkpoint_rootfs: dict[str, int] = {}

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        long_running: bool = False,
    ) -> RuntimeProcess:
        command = self.check_argv(argv)
        server = None if long_running or not serves(env) else await self._exec_server()
        if server is not None:
            return await server.spawn(command, env=env or {}, cwd=cwd or self.workdir, stdin=stdin)
        pid_file, prefix = await self.control_files(stdin)
        created = await call(
            "exec create",
            self.client.api.exec_create,
            self.container.id,
            [*prefix, *command],
            environment=dict(env) if env else None,
            workdir=cwd or self.workdir,
        )
        process = DockerProcess(self, created["Id"], pid_file)
        process.pump(await call("exec start", self.client.api.exec_start, created["Id"], socket=True))
        return process

    async def _exec_server(self) -> ExecServer | None:
        """The container's exec server, started on first use (again after it died); None where it cannot run
        (no ``bash`` in the image): then every command is an engine exec of its own."""
        async with self._server_lock:
            if self._server is not None and self._server.alive:
                return self._server
            if self._server_failure is not None or self.closed:
                return None
            control = self.scratch.run / f"server-{next(self._counter)}"
            control.mkdir()
            control.chmod(0o777)  # the container's user may be another uid (the scratch root stays 0700)
            remote = f"{RUN_PATH}/{control.name}"
            await write_bytes(control / "server.sh", SERVER_SCRIPT, 0o644)
            created = await call("exec create", self.client.api.exec_create, self.container.id,
                                 ["bash", f"{remote}/server.sh"], stdin=True, workdir="/")  # fmt: skip
            sock = await call("exec start", self.client.api.exec_start, created["Id"], socket=True)
            server = ExecServer(control, remote, getattr(sock, "_sock", sock).sendall)
            loop = asyncio.get_running_loop()

            def emit(stream: Stream | None, chunk: bytes) -> None:  # the server's stderr is not read
                with contextlib.suppress(RuntimeError):  # loop closed: nobody listens any more
                    if stream is None:
                        loop.call_soon_threadsafe(server.lost)
                    elif stream == "stdout":
                        loop.call_soon_threadsafe(server.feed, chunk)

            pump_stream(sock, emit, f"polar-docker-server-{created['Id'][:12]}")
            try:
                await await_ready(server, SERVER_START_SECONDS)
            except RuntimeFailure as exc:
                server.close()
                if not await self.container_running():
                    raise RuntimeFailure(f"session {self.session_id}: the container is not running") from exc
                self._server_failure = str(exc)
                return None
            self._server = server
            return server

    async def container_running(self) -> bool:
        try:
            info = await call("container inspect", self.client.api.inspect_container, self.container.id)
        except RuntimeFailure as exc:
            if _is_not_found(exc):
                return False
            raise
        return bool((info.get("State") or {}).get("Running"))

    async def _script(self, script: str, what: str, stdin: str = "", *, own_exec: bool = False) -> ExecResult:
        """``script`` through ``sh -c``; ``own_exec``: as an engine exec of its own, outside the exec server (a
        script that kills the container's processes must not kill the server process that runs it)."""
        result = await self.exec(["/bin/sh", "-c", script], stdin=stdin.encode(), timeout=120, long_running=own_exec)
        if result.timed_out or result.exit_code not in (0, 1):
            raise RuntimeFailure(f"session {self.session_id}: {what} failed: {result.stderr.strip() or result.stdout}")
        return result

    async def _diff(self) -> dict[str, int]:
        changes = await call("container diff", self.container.diff) or []
        return {str(c["Path"]): int(c["Kind"]) for c in changes}

    async def checkpoint_inside(self) -> None:
        await self._script(f"touch {ROOTFS_MARKER}", "the checkpoint marker")
        pids = await self._script(PIDS_SCRIPT, "the process list")
        self._checkpoint_pids = pids.stdout
        self._checkpoint_rootfs = await self._diff()

    async def kill_since_checkpoint(self) -> None:
        survivors = (await self._script(KILL_NEW_SCRIPT, "killing the session's processes", self._checkpoint_pids,
                                        own_exec=True)).stdout.split()  # fmt: skip
        if survivors:
            raise RuntimeFailure(f"session {self.session_id}: processes {shown(survivors)} survived SIGKILL")

    async def restore_inside(self) -> None:
        lines, broken = rootfs_plan(self._checkpoint_rootfs, await self._diff(), self.kept)
        if broken:
            raise RuntimeFailure(f"changed since the checkpoint: {shown(broken)}")
        applied = await self._script(APPLY_SCRIPT, "the rootfs restore", "".join(f"{line}\n" for line in lines))
        if applied.exit_code != 0:
            raise RuntimeFailure(f"the rootfs cannot be restored: {shown(applied.stdout.splitlines())}")
        lines, broken = rootfs_plan(self._checkpoint_rootfs, await self._diff(), self.kept)
        added = [line[2:] for line in lines if line.startswith("R ")]
        if broken or added:
            raise RuntimeFailure(f"the rootfs still differs from the checkpoint: {shown(broken + added)}")

    async def kill_in_container(self, sig: str, pid: int) -> None:
        """Signal an engine exec's process group by an engine exec of its own: never through the exec server, which
        the agent may have stopped or killed (the harness is an engine exec so that it cannot be lost that way)."""
        with contextlib.suppress(RuntimeFailure):
            await call("kill", self.container.exec_run, ["/bin/sh", "-c", KILL_SCRIPT, "sh", sig, str(pid)])

    async def release(self, grace: float) -> None:
        if self._server is not None:
            self._server.close()
        if self.container is None:
            return
        if grace > 0:
            with contextlib.suppress(RuntimeFailure):
                await call("stop", self.container.stop, timeout=int(max(1, grace)))
        try:
            await call("remove", self.container.remove, force=True, v=True)
        except RuntimeFailure as exc:
            if not _is_not_found(exc):
                raise

    async def remove_scratch(self) -> None:
        try:
            await remove_scratch_dir(self.client, self.image_id, self.scratch.root)
        finally:
            with contextlib.suppress(Exception):
                self.client.close()


async def remove_scratch_dir(client: Any, image_id: str, root: Path) -> None:
    """Remove a session's scratch dir; files the container's root wrote there are handed back first when the host
    user cannot delete them (which needs the container's image: without one, the PermissionError stands)."""
    try:
        await asyncio.to_thread(remove_tree, root)
    except PermissionError:
        if not image_id:
            raise
        await hand_back_files(client, image_id, root)
        await asyncio.to_thread(remove_tree, root)


async def hand_back_files(client: Any, image_id: str, root: Path) -> None:
    """Files a container's root wrote cannot be deleted by a non-root host user: chown them back first."""
    owner = f"{os.getuid()}:{os.getgid()}"
    await call(
        "chown of session files",
        client.containers.run,
        image_id,
        entrypoint=["chown", "-R", owner, "/scratch"],
        user="0",
        network_mode="none",
        volumes={str(root): {"bind": "/scratch", "mode": "rw"}},
        remove=True,
    )


def _owner_labels() -> dict[str, str]:
    me = this_process()
    labels = {LABEL_OWNER: f"{me.host}:{me.pid}"}
    if me.started is not None:
        labels[LABEL_OWNER_STARTED] = str(me.started)
    return labels


def _leftover(container: Any) -> Leftover:
    """A Polar container as a sweep sees it, from its labels and creation time."""
    labels = container.labels or {}
    host, _, pid = str(labels.get(LABEL_OWNER, "")).rpartition(":")
    started = str(labels.get(LABEL_OWNER_STARTED, ""))
    owner = Owner(host, int(pid) if pid.isdigit() else None, int(started) if started.isdigit() else None)
    created = str(container.attrs.get("Created") or "")
    scratch = labels.get(LABEL_SCRATCH)
    return Leftover(runtime="docker", kind="container", name=container.name, session_id=labels.get(LABEL_SESSION, ""),
                    node_id=labels.get(LABEL_NODE), owner=owner, created=_unix_time(created), ref=container.id,
                    scratch=Path(scratch) if scratch and host == socket.gethostname() else None)  # fmt: skip


def _unix_time(docker_time: str) -> float:
    """Docker's ``Created`` (RFC 3339 with nanoseconds) as Unix time; 0 when it cannot be read."""
    try:
        return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", docker_time).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _check_mounts(spec: RuntimeSpec) -> None:
    """The host side of the spec, checked where the container starts."""
    for mount in spec.mounts:
        if not os.path.isabs(mount.source) or not os.path.exists(mount.source):
            raise ConfigError(f"runtime 'docker': mount source {mount.source!r} must be an existing absolute path")


class DockerRuntime(ContainerRuntime):
    name: ClassVar[str] = "docker"
    can_restore: ClassVar[bool] = True
    description: ClassVar[str] = "one Docker container per session (needs the docker extra)"
    options: ClassVar[type[BaseModel]] = DockerOptions

    async def start(self, spec: RuntimeSpec, context: RuntimeContext) -> DockerHandle:
        options: DockerOptions = self.check_spec(spec)
        _check_mounts(spec)
        client = await asyncio.to_thread(docker_client)
        image = await self._image(client, str(spec.image), options.pull)
        scratch = await asyncio.to_thread(Scratch.for_session, context, self.name)
        open_dirs_for_container_users(scratch)
        handle = DockerHandle(scratch, context, client, spec.workdir or SESSION_PATH)
        handle.image_id = image.id
        try:
            handle.container = await call("container create", client.containers.create, **self._create_args(
                spec, context, handle, image, options))  # fmt: skip
            await call("container start", handle.container.start)
        except BaseException:
            await handle.cancel()
            raise
        return handle

    async def _image(self, client: Any, image: str, pull: str) -> Any:
        if pull != "always":
            try:
                return await call("image inspect", client.images.get, image)
            except RuntimeFailure as exc:
                if not _is_not_found(exc):
                    raise
                if pull == "never":
                    raise RuntimeFailure(f"docker image {image!r} is not present (config pull: never)") from exc
        return await call(f"pull of {image!r}", client.images.pull, image)

    def _create_args(
        self, spec: RuntimeSpec, context: RuntimeContext, handle: DockerHandle, image: Any, options: DockerOptions
    ) -> dict[str, Any]:
        image_env = dict(e.split("=", 1) for e in (image.attrs.get("Config") or {}).get("Env") or [] if "=" in e)
        env = {**context.env, **spec.env}
        if context.tools_dir and "PATH" not in spec.env:
            env["PATH"] = f"{TOOLS_PATH}/bin:{image_env.get('PATH', DEFAULT_PATH)}"
        env.update(HOME=HOME_PATH, POLAR_SESSION_ID=context.session_id, POLAR_SESSION_DIR=SESSION_PATH)
        volumes = {host: {"bind": target, "mode": "ro" if ro else "rw"} for host, target, ro in handle.binds(context)}
        for mount in spec.mounts:
            volumes[mount.source] = {"bind": mount.target, "mode": "ro" if mount.read_only else "rw"}
        args: dict[str, Any] = {
            "image": image.id,
            "command": options.command or ["sleep", "infinity"],
            "name": f"polar-{handle.scratch.root.name}",
            "labels": {
                LABEL_SESSION: context.session_id,
                LABEL_RUNTIME: "docker",
                **({LABEL_NODE: context.node_id} if context.node_id else {}),
                **_owner_labels(),
                LABEL_SCRATCH: str(handle.scratch.root),
            },
            "environment": env,
            "working_dir": handle.workdir,
            "network_mode": spec.network or "host",
            "volumes": volumes,
            "init": options.init,
            "detach": True,
        }
        if spec.cpus is not None:
            args["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.memory is not None:
            args["mem_limit"] = spec.memory
        if options.user:
            args["user"] = options.user
        return args

    async def leftovers(self, scratch_root: Path | None = None, node_id: str | None = None) -> list[Leftover]:
        """Polar's containers (of ``node_id`` only, when given), then the scratch dirs no container names."""
        client = await asyncio.to_thread(docker_client)
        labels = [f"{LABEL_RUNTIME}=docker", *([f"{LABEL_NODE}={node_id}"] if node_id else [])]
        try:
            # ignore_removed: a container removed between the list and its inspect (a session ending) is not a failure
            containers = await call(
                "list", client.containers.list, all=True, filters={"label": labels}, ignore_removed=True
            )
        finally:
            client.close()
        found = [_leftover(container) for container in containers]
        named = {str(item.scratch) for item in found if item.scratch is not None}
        dirs = await super().leftovers(scratch_root, node_id)
        return found + [item for item in dirs if str(item.scratch) not in named]

    async def remove_leftover(self, leftover: Leftover) -> None:
        if leftover.kind != "container":
            await super().remove_leftover(leftover)
            return
        client = await asyncio.to_thread(docker_client)
        try:
            try:
                container = await call("inspect", client.containers.get, leftover.ref)
                image_id = str(container.attrs.get("Image") or "")
                await call("remove", container.remove, force=True, v=True)
            except RuntimeFailure as exc:
                if not _is_not_found(exc):
                    raise
                image_id = ""
            if leftover.scratch is not None:
                await remove_scratch_dir(client, image_id, leftover.scratch)
        finally:
            client.close()
