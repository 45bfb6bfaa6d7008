"""The ``apptainer`` runtime: one rootless Apptainer (or SingularityCE) instance per session, through ``spython``.

Lifecycle (``instance start`` / ``instance list`` / ``instance stop``) goes through spython's ``Instance``, with its
command builder pointed at the configured binary. Commands are ``apptainer exec --cleanenv --pwd CWD instance://NAME
...`` run as asyncio subprocesses (spython's own exec blocks and cannot be cancelled); their environment travels as
``APPTAINERENV_*`` variables, never on a command line. The instance gets ``--containall`` (own PID/IPC namespaces,
no host home, clean env), the fixed binds, a writable overlay (a per-session directory by default) and shares the
host network unless ``network: none``.

``config``: ``binary`` (default: ``apptainer`` then ``singularity`` on PATH), ``overlay`` (true: a per-session
directory, false: none, a string: that overlay image or directory), ``containall`` (default true), ``options``
(extra ``instance start`` flags, e.g. ``["--nv"]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from polar_cli.aio import within
from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import (
    HOME_PATH,
    SESSION_PATH,
    TOOLS_PATH,
    RuntimeContext,
    RuntimeProcess,
)
from polar_cli.models import StrictModel
from polar_cli.models.task import RuntimeSpec
from polar_cli.runtimes.base import terminate_all
from polar_cli.runtimes.container import KILL_SCRIPT, ContainerHandle, ContainerRuntime, read_pid
from polar_cli.runtimes.process import HostProcess
from polar_cli.runtimes.scratch import Scratch


class ApptainerOptions(StrictModel):
    """``RuntimeSpec.config`` of ``apptainer``."""

    model_config = ConfigDict(coerce_numbers_to_str=True)  # options: ["--cpus", 2]

    binary: str | None = Field(default=None, description="default: apptainer, then singularity, on PATH")
    overlay: bool | str = Field(default=True, description="true: a per-session dir; false: none; else that overlay")
    containall: bool = Field(default=True, description="own PID/IPC namespaces, no host home, clean env")
    options: list[str] = Field(default_factory=list, description="extra `instance start` flags, e.g. [--nv]")


def find_binary(configured: str | None = None) -> str:
    for candidate in [configured] if configured else ["apptainer", "singularity"]:
        found = shutil.which(candidate)
        if found:
            return found
    wanted = configured or "apptainer (or singularity)"
    raise RuntimeFailure(f"the apptainer runtime needs {wanted} on PATH")


def env_prefix(binary: str) -> str:
    return "SINGULARITYENV_" if os.path.basename(binary).startswith("singularity") else "APPTAINERENV_"


def instance_name(scratch: Scratch) -> str:
    return f"polar-{scratch.root.name}"


def make_instance(image: str, name: str, binary: str) -> Any:
    """An unstarted spython Instance whose commands use ``binary`` (spython itself hard-codes ``singularity``)."""
    try:
        from spython.instance import Instance
        from spython.main import Client  # noqa: F401  (importing it attaches start/stop/_list to Instance)
    except ImportError as exc:
        raise RuntimeFailure("the apptainer runtime needs 'spython': pip install 'polar-rl[apptainer]'") from exc
    instance = Instance(image, start=False, name=name, quiet=True)

    def init_command(action: str | list[str], flags: list[str] | None = None) -> list[str]:
        return [binary, *(flags or []), *([action] if isinstance(action, str) else action)]

    instance._init_command = init_command
    return instance


def _bind(host: str, target: str, read_only: bool) -> list[str]:
    for path in (host, target):
        if "," in path or ":" in path:
            raise ConfigError(f"runtime 'apptainer': bind path {path!r} may not contain ',' or ':'")
    return ["--bind", f"{host}:{target}" + (":ro" if read_only else "")]


class ApptainerHandle(ContainerHandle):
    def __init__(self, scratch: Scratch, context: RuntimeContext, spec: RuntimeSpec, binary: str) -> None:
        super().__init__(scratch, context)
        self.binary = binary
        self.name = instance_name(scratch)
        self.instance: Any = None
        self.workdir = spec.workdir or SESSION_PATH
        self._processes: list[HostProcess] = []
        prefix = env_prefix(binary)
        env = {**context.env, **spec.env, "POLAR_SESSION_ID": context.session_id, "POLAR_SESSION_DIR": SESSION_PATH}
        self._container_env = env
        self._prefix = prefix
        self._prepend_path = f"{TOOLS_PATH}/bin" if context.tools_dir and "PATH" not in spec.env else None

    def host_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The apptainer client's own environment: a clean host base plus the command's variables, prefixed."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8")}
        for key, value in {**self._container_env, **(extra or {})}.items():
            env[self._prefix + key] = value
        if self._prepend_path and "PATH" not in (extra or {}):
            env[self._prefix + "PREPEND_PATH"] = self._prepend_path
        return env

    def start_options(self, spec: RuntimeSpec, config: ApptainerOptions, context: RuntimeContext) -> list[str]:
        options: list[str] = ["--containall"] if config.containall else []
        for host, target, read_only in self.binds(context):
            if target == HOME_PATH:
                options += ["--home", f"{host}:{target}"]
            else:
                options += _bind(host, target, read_only)
        for mount in spec.mounts:
            options += _bind(mount.source, mount.target, mount.read_only)
        overlay = config.overlay
        if overlay is True:
            overlay_dir = self.scratch.root / "overlay"
            overlay_dir.mkdir(exist_ok=True)
            options += ["--overlay", str(overlay_dir)]
        elif isinstance(overlay, str) and overlay:
            options += ["--overlay", overlay]
        if spec.network not in (None, "host"):
            options += ["--net", "--network", spec.network]
        if spec.cpus is not None:
            options += ["--cpus", f"{spec.cpus:g}"]
        if spec.memory is not None:
            options += ["--memory", spec.memory]
        options += config.options
        return options

    def exec_argv(self, argv: list[str], cwd: str | None) -> list[str]:
        return [self.binary, "exec", "--cleanenv", "--pwd", cwd or self.workdir, f"instance://{self.name}", *argv]

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
        pid_file, prefix = await self.control_files(stdin)
        process = await HostProcess.start(
            self.exec_argv([*prefix, *command], cwd), env=self.host_env(env), cwd=self.scratch.run
        )

        async def kill_inside(grace: float) -> None:
            pid = read_pid(pid_file)
            if pid is not None and process.process.returncode is None:
                for sig in ("TERM", "KILL") if grace > 0 else ("KILL",):
                    await self._kill_in_instance(sig, pid)
                    with contextlib.suppress(TimeoutError):
                        await within(process.wait(), grace)
                    if process.process.returncode is not None:
                        return

        process.before_terminate = kill_inside
        self._processes.append(process)
        return process

    async def _kill_in_instance(self, sig: str, pid: int) -> None:
        killer = await HostProcess.start(
            self.exec_argv(["/bin/sh", "-c", KILL_SCRIPT, "sh", sig, str(pid)], "/"),
            env=self.host_env(),
            cwd=self.scratch.run,
        )
        with contextlib.suppress(TimeoutError):
            await within(killer.wait(), 30)

    async def release(self, grace: float) -> None:
        await terminate_all(self._processes, grace)
        if self.instance is not None:
            await asyncio.to_thread(self.instance.stop, timeout=max(1, int(grace)), quiet=True)


class ApptainerRuntime(ContainerRuntime):
    name: ClassVar[str] = "apptainer"
    description: ClassVar[str] = "one rootless Apptainer instance per session (needs the apptainer extra)"
    options: ClassVar[type[BaseModel]] = ApptainerOptions
    image_hint: ClassVar[str] = " (a .sif path or a URI such as docker://...)"

    async def start(self, spec: RuntimeSpec, context: RuntimeContext) -> ApptainerHandle:
        config: ApptainerOptions = self.check_spec(spec)
        binary = find_binary(config.binary)
        scratch = await asyncio.to_thread(Scratch.for_session, context, self.name)
        handle = ApptainerHandle(scratch, context, spec, binary)
        try:
            options = handle.start_options(spec, config, context)
            instance = make_instance(str(spec.image), handle.name, binary)
            environ = handle.host_env()
            await asyncio.to_thread(instance.start, options=options, capture=True, environ=environ, quiet=True)
            if getattr(instance, "pid", None) is None:  # spython reports failures only through its logger
                raise RuntimeFailure(f"apptainer: instance start failed: {' '.join(instance.cmd)}")
            handle.instance = instance
        except BaseException:
            await handle.cancel()
            raise
        return handle

    async def release_leftover(self, root: Path) -> None:
        with contextlib.suppress(RuntimeFailure):
            instance = make_instance("", instance_name(Scratch(root)), find_binary())
            await asyncio.to_thread(instance.stop, timeout=1, quiet=True)
