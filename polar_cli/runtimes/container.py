"""What the container runtimes (docker, apptainer) share: the image check, the fixed mount layout and file copies.

Host scratch dirs are bind-mounted at fixed paths: ``session`` at /polar/session, ``home`` at /polar/home, ``run`` at
/polar/run (control files: pid files, stdin), the tools dir read-only at /polar/tools. Files under the first two are
copied on the host side (no exec at all); anything else goes through a staging file in ``run`` and one command inside
the container (:data:`COPY_SCRIPT`: mkdir, then ``cp -a``, or ``cp`` and ``chmod`` for a written file).

Every engine exec runs as ``/bin/sh -c EXEC_SCRIPT polar-exec PIDFILE STDIN ARGV...``: the wrapper records its pid (the
command's process group: container runtimes start each exec as a session leader) so a timeout or cancel can kill the
group from inside, then ``exec``s the argv unchanged. A missing command therefore exits 127. (Docker runs short
commands through its in-container exec server instead, see ``exec_server.py``.)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import (
    HOME_PATH,
    RUN_PATH,
    SESSION_PATH,
    TOOLS_PATH,
    RuntimeContext,
)
from polar_cli.models.task import RuntimeSpec
from polar_cli.runtimes.base import ScratchHandle, ScratchRuntime
from polar_cli.runtimes.files import copy_path, under, write_bytes
from polar_cli.runtimes.scratch import Scratch, remove_tree

EXEC_SCRIPT = 'p="$1"; i="$2"; shift 2; echo $$ >"$p"; exec "$@" <"$i"'
# a copy outside the bind mounts in one exec: `sh -c COPY_SCRIPT sh SOURCE TARGET_DIR TARGET MODE`; an upload
# (MODE '') keeps what `cp -a` keeps, a written file (MODE set) belongs to the container's user, with that mode
COPY_SCRIPT = (
    'mkdir -p -- "$2" && if [ -z "$4" ]; then cp -a -- "$1" "$3"; else cp -- "$1" "$3" && chmod -- "$4" "$3"; fi'
)
# kill the recorded process group (and the pid itself, should it not lead a group): `sh -c KILL_SCRIPT sh SIG PID`
KILL_SCRIPT = 'kill -s "$1" -- "-$2" 2>/dev/null; kill -s "$1" "$2" 2>/dev/null; true'


class ContainerHandle(ScratchHandle):
    """Base of the docker and apptainer handles: layout, argv wrapping and file operations."""

    def __init__(self, scratch: Scratch, context: RuntimeContext) -> None:
        super().__init__(scratch, context.session_id)
        self.session_path = SESSION_PATH
        self.home_path = HOME_PATH
        self.tools_path = TOOLS_PATH if context.tools_dir else None
        self._counter = itertools.count()

    def binds(self, context: RuntimeContext) -> list[tuple[str, str, bool]]:
        """(host, container, read_only) for the fixed layout."""
        binds = [
            (str(self.scratch.session), SESSION_PATH, False),
            (str(self.scratch.home), HOME_PATH, False),
            (str(self.scratch.run), RUN_PATH, False),
        ]
        if context.tools_dir:
            binds.append((str(Path(context.tools_dir).resolve()), TOOLS_PATH, True))
        return binds

    async def control_files(self, stdin: bytes | None) -> tuple[Path, list[str]]:
        """A fresh pid file (host path) and the wrapper argv prefix (``sh -c EXEC_SCRIPT ...``)."""
        n = next(self._counter)
        pid_name = f"exec-{n}.pid"
        stdin_path = "/dev/null"
        if stdin is not None:
            await write_bytes(self.scratch.run / f"exec-{n}.stdin", stdin, 0o600)
            stdin_path = f"{RUN_PATH}/exec-{n}.stdin"
        prefix = ["/bin/sh", "-c", EXEC_SCRIPT, "polar-exec", f"{RUN_PATH}/{pid_name}", stdin_path]
        return self.scratch.run / pid_name, prefix

    def _host(self, path: str) -> Path | None:
        if not posixpath.isabs(path):
            path = posixpath.join(SESSION_PATH, path)
        for base, host in ((SESSION_PATH, self.scratch.session), (HOME_PATH, self.scratch.home)):
            rest = under(path, base)
            if rest is not None:
                return host / rest if rest else host
        return None

    def host_of(self, path: str) -> Path | None:
        return self._host(path)

    def _inside(self, host: Path) -> str | None:
        """The runtime path of a host path under the session or home dir."""
        for base, root in ((SESSION_PATH, self.scratch.session), (HOME_PATH, self.scratch.home)):
            if root in host.parents:
                return posixpath.join(base, host.relative_to(root).as_posix())
        return None

    async def remove_added(self, paths: Sequence[Path]) -> None:
        """Files the container's root wrote may not be removable by the host user: those go from inside."""
        inside = []
        for path in paths:
            try:
                await asyncio.to_thread(remove_tree, path)
            except PermissionError:
                target = self._inside(path)
                if target is None:
                    raise
                inside.append(target)
        if inside:
            await self._in_container(["rm", "-rf", "--", *inside], "removal of session files")

    async def _in_container(self, argv: list[str], what: str) -> None:
        result = await self.exec(argv, timeout=300)
        if not result.ok:
            reason = result.stderr.strip() or f"exit {result.exit_code}"
            raise RuntimeFailure(f"session {self.session_id}: {what} failed: {reason}")

    async def _copy_in(self, staged: str, remote: str, what: str, mode: str = "") -> None:
        """Copy ``staged`` (in the run dir) to ``remote`` inside the container, parents made, in one command."""
        source, parent = f"{RUN_PATH}/{staged}", posixpath.dirname(remote) or "/"
        await self._in_container(["/bin/sh", "-c", COPY_SCRIPT, "sh", source, parent, remote, mode], what)

    async def upload(self, local: Path, remote: str) -> None:
        local = Path(local)
        host = self._host(remote)
        if host is not None:
            await copy_path(local, host)
            return
        staged = f"xfer-{next(self._counter)}"
        try:
            await copy_path(local, self.scratch.run / staged)
            if local.is_dir():  # the tree's contents into `remote`, made if missing
                await self._copy_in(f"{staged}/.", f"{remote.rstrip('/')}/.", f"upload to {remote}")
            else:
                await self._copy_in(staged, remote, f"upload to {remote}")
        finally:
            remove_tree(self.scratch.run / staged)

    async def download(self, remote: str, local: Path) -> None:
        host = self._host(remote)
        if host is not None:
            if not host.exists():
                raise RuntimeFailure(f"session {self.session_id}: {remote} does not exist")
            await copy_path(host, Path(local))
            return
        staged = f"xfer-{next(self._counter)}"
        try:
            await self._in_container(["cp", "-a", remote, f"{RUN_PATH}/{staged}"], f"download of {remote}")
            await copy_path(self.scratch.run / staged, Path(local))
        finally:
            remove_tree(self.scratch.run / staged)

    async def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644) -> None:
        host = self._host(path)
        if host is not None:
            await write_bytes(host, content, mode)
            return
        staged = self.scratch.run / f"xfer-{next(self._counter)}"
        try:
            await write_bytes(staged, content, mode)
            await self._copy_in(staged.name, path, f"write of {path}", f"{mode:o}")
        finally:
            remove_tree(staged)


class ContainerRuntime(ScratchRuntime):
    """Base of the docker and apptainer runtimes: a spec names the image its sessions start from."""

    image_hint: ClassVar[str] = ""
    """What ``image`` may be, said when a spec lacks it."""

    def check_spec(self, spec: RuntimeSpec) -> Any:
        if not spec.image:
            raise ConfigError(f"runtime {self.name!r} needs 'image'{self.image_hint}")
        return super().check_spec(spec)


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def open_dirs_for_container_users(scratch: Scratch) -> None:
    """A container user other than the host's may need to write the bind-mounted dirs; the scratch root itself
    stays 0700 on the host, so this opens nothing to other host users."""
    for sub in (scratch.session, scratch.home, scratch.run):
        os.chmod(sub, 0o777)
