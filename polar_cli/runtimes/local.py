"""The ``local`` runtime: host processes in a private session directory, the embedded default.

Each session gets ``<scratch_root>/local-<id>-<random>/{session,home,tmp,run}`` (mode 0700), a clean environment
(PATH, LANG, TERM from the host, then the explicitly passed variables) with HOME and TMPDIR inside it, and every
command in its own process group. With ``isolation: namespace`` (the default when ``unshare`` works, e.g. as root or
with unprivileged user namespaces) each command also runs in a private mount namespace where a tmpfs hides the whole
scratch root except this session's own directory, so no session can see another's files.

Paths: ``session_path``/``home_path``/``tools_path`` are the real host paths; ``cwd``, ``spec.workdir`` and file
operation paths may also use the fixed ``/polar/session``, ``/polar/home`` and ``/polar/tools`` forms, or be relative
to the session directory. Arguments are never rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from polar_cli.aio import within
from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import (
    HOME_PATH,
    KILL_GRACE_SECONDS,
    SESSION_PATH,
    TOOLS_PATH,
    RuntimeContext,
    RuntimeProcess,
)
from polar_cli.models import StrictModel
from polar_cli.models.task import RuntimeSpec
from polar_cli.runtimes.base import ScratchHandle, ScratchRuntime, terminate_all
from polar_cli.runtimes.files import copy_path, under, write_bytes
from polar_cli.runtimes.process import POLL_SECONDS, HostProcess
from polar_cli.runtimes.scratch import Scratch


class LocalOptions(StrictModel):
    """``RuntimeSpec.config`` of ``local``."""

    isolation: Literal["auto", "namespace", "none"] = Field(
        default="auto", description="namespace: a private mount namespace per command; auto: that when it works"
    )


# Runs as `sh -c NS_SCRIPT polar-ns ROOT PARENT CWD ARGV...` inside `unshare --mount`: hide every session's scratch
# under a tmpfs, then bind this session's root back (via the still-open cwd: /proc/self/cwd, not canonicalized).
# The command's own arguments only ever travel as "$@".
NS_SCRIPT = (
    'set -e; cd "$1"; mount -t tmpfs -o mode=0711,size=64k polar-hide "$2"; mkdir "$1"; '
    'mount --no-canonicalize --bind /proc/self/cwd "$1"; cd "$3"; shift 3; exec "$@"'
)


def base_environment() -> dict[str, str]:
    """The only host variables a local command inherits."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TERM": os.environ.get("TERM", "dumb"),
    }


def _marked_pids(marker: bytes) -> list[int]:
    """Processes whose environment carries ``marker`` (our POLAR_SESSION_DIR): what a session started."""
    found = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as handle:
                    environ = handle.read()
            except OSError:
                continue
            if (b"\0" + environ).find(b"\0" + marker + b"\0") >= 0:
                found.append(int(entry.name))
    return found


async def kill_marked(marker: bytes, grace: float) -> None:
    """SIGTERM every process carrying ``marker``, SIGKILL what is left after ``grace`` seconds."""
    sig = signal.SIGTERM if grace > 0 else signal.SIGKILL
    deadline = time.monotonic() + grace
    while True:
        pids = await asyncio.to_thread(_marked_pids, marker)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL:
            await asyncio.sleep(POLL_SECONDS)
            if time.monotonic() > deadline + 5:
                return  # unkillable (D state) or not ours to kill; stop trying
            continue
        await asyncio.sleep(POLL_SECONDS)
        if time.monotonic() >= deadline:
            sig = signal.SIGKILL


class LocalHandle(ScratchHandle):
    def __init__(self, scratch: Scratch, spec: RuntimeSpec, context: RuntimeContext, isolation: str) -> None:
        super().__init__(scratch, context.session_id)
        self.session_path = str(scratch.session)
        self.home_path = str(scratch.home)
        self.tools_path = str(context.tools_dir) if context.tools_dir else None
        self.isolation = isolation
        self._processes: list[HostProcess] = []
        self._checkpoint_pids: set[int] = set()
        env = base_environment()
        if self.tools_path:
            env["PATH"] = f"{self.tools_path}/bin:{env['PATH']}"
        env.update(context.env)
        env.update(spec.env)
        env.update(
            HOME=self.home_path,
            TMPDIR=str(scratch.tmp),
            POLAR_SESSION_ID=self.session_id,
            POLAR_SESSION_DIR=self.session_path,
        )
        self._env = env
        self._marker = f"POLAR_SESSION_DIR={self.session_path}".encode()
        self._workdir = self.host_path(spec.workdir) if spec.workdir else scratch.session
        self.workdir = str(self._workdir)

    def host_path(self, path: str) -> Path:
        """Where a runtime path lives on the host (fixed ``/polar/...`` forms and relative paths translated)."""
        if not os.path.isabs(path):
            return self.session_dir / path
        bases = ((SESSION_PATH, self.session_path), (HOME_PATH, self.home_path), (TOOLS_PATH, self.tools_path))
        for base, host in bases:
            rest = under(path, base)
            if rest is not None and host is not None:
                return Path(host) / rest if rest else Path(host)
        return Path(path)

    def _wrap(self, argv: list[str], cwd: Path) -> list[str]:
        if self.isolation != "namespace":
            return argv
        userns = ["--map-root-user"] if os.geteuid() != 0 else []
        root, parent = str(self.scratch.root), str(self.scratch.parent)
        return ["unshare", "--mount", "--propagation", "private", *userns, "--",
                "/bin/sh", "-c", NS_SCRIPT, "polar-ns", root, parent, str(cwd), *argv]  # fmt: skip

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
        workdir = self.host_path(cwd) if cwd else self._workdir
        if not workdir.is_dir():
            raise RuntimeFailure(f"session {self.session_id}: working directory {workdir} does not exist")
        process = await HostProcess.start(
            self._wrap(command, workdir), env={**self._env, **(env or {})}, cwd=workdir, stdin=stdin
        )
        self._processes.append(process)
        return process

    async def upload(self, local: Path, remote: str) -> None:
        await copy_path(Path(local), self.host_path(remote))

    async def download(self, remote: str, local: Path) -> None:
        source = self.host_path(remote)
        if not source.exists():
            raise RuntimeFailure(f"session {self.session_id}: {remote} does not exist")
        await copy_path(source, Path(local))

    async def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644) -> None:
        await write_bytes(self.host_path(path), content, mode)

    def host_of(self, path: str) -> Path | None:
        return self.host_path(path)

    async def checkpoint_inside(self) -> None:
        self._checkpoint_pids = set(await asyncio.to_thread(_marked_pids, self._marker))

    async def kill_since_checkpoint(self) -> None:
        await terminate_all(self._processes, 0.0)
        self._processes = [p for p in self._processes if p.process.returncode is None]
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while True:
            pids = set(await asyncio.to_thread(_marked_pids, self._marker)) - self._checkpoint_pids
            if not pids:
                return
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"session {self.session_id}: processes {sorted(pids)} survived SIGKILL")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(POLL_SECONDS)

    async def release(self, grace: float) -> None:
        await terminate_all(self._processes, grace)
        await kill_marked(self._marker, grace)
        for process in self._processes:
            with contextlib.suppress(TimeoutError):
                await within(process.wait(), KILL_GRACE_SECONDS)


class LocalRuntime(ScratchRuntime):
    name: ClassVar[str] = "local"
    can_restore: ClassVar[bool] = True
    description: ClassVar[str] = "host processes in a private session dir and home (mount-namespace isolated)"

    options: ClassVar[type[BaseModel]] = LocalOptions

    def check_spec(self, spec: RuntimeSpec) -> LocalOptions:
        unsupported = [name for name in ("image", "cpus", "memory") if getattr(spec, name) is not None]
        if spec.mounts:
            unsupported.append("mounts")
        if spec.network not in (None, "host"):
            unsupported.append("network")
        if unsupported:
            fields = ", ".join(unsupported)
            raise ConfigError(f"runtime 'local' cannot honour {fields}: use backend 'docker' or 'apptainer'")
        options: LocalOptions = super().check_spec(spec)
        return options

    async def start(self, spec: RuntimeSpec, context: RuntimeContext) -> LocalHandle:
        isolation = self.check_spec(spec).isolation
        scratch = await asyncio.to_thread(Scratch.for_session, context, self.name)
        chosen = "none" if isolation == "none" else "namespace"
        handle = LocalHandle(scratch, spec, context, chosen)
        if handle.session_dir in handle._workdir.parents:  # a workdir inside the session dir is made for it
            handle._workdir.mkdir(parents=True, exist_ok=True)
        if chosen == "namespace":
            try:
                probe = await handle.exec(["true"], timeout=30)
                reason = "" if probe.ok else probe.stderr.strip() or f"exit {probe.exit_code}"
            except RuntimeFailure as exc:  # e.g. no unshare binary
                reason = str(exc)
            except BaseException:
                await handle.cancel()
                raise
            if reason:
                if isolation == "namespace":
                    await handle.cancel()
                    raise RuntimeFailure(f"local runtime: mount-namespace isolation unavailable: {reason}")
                handle.isolation = "none"
        return handle

    async def release_leftover(self, root: Path) -> None:
        await kill_marked(f"POLAR_SESSION_DIR={root / 'session'}".encode(), KILL_GRACE_SECONDS)
