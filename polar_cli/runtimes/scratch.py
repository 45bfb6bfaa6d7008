"""Per-session host directories (session, home, tmp, run), who made them, and finding them again.

Each scratch root holds ``.owner.json``: the session, the backend, the gateway node, the creating process (host, pid,
start time) and when it was made. :func:`scratch_leftovers` reads them back as :class:`Leftover` s;
:func:`owner_alive` says whether a creating process still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_cli.ids import id_part
from polar_cli.interfaces.runtime import Leftover, Owner, RuntimeContext

OWNER_FILE = ".owner.json"


def default_scratch_root() -> Path:
    return Path(tempfile.gettempdir()) / f"polar-runtime-{os.getuid()}"


def _safe(text: str) -> str:
    return id_part(text, 40) or "session"


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22 of stat; the name before ")" may hold spaces
    except (IndexError, ValueError):
        return None


def this_process() -> Owner:
    pid = os.getpid()
    return Owner(host=socket.gethostname(), pid=pid, started=process_started(pid))


def is_this_process(owner: Owner) -> bool:
    """Whether this very process made it (not an earlier process that had its pid)."""
    if owner.host != socket.gethostname() or owner.pid != os.getpid():
        return False
    return owner.started is None or owner.started == process_started(os.getpid())


def owner_alive(owner: Owner) -> bool:
    """Whether the process that made something still runs: the same pid started at the same time (a recycled pid is
    another process). Another host's process counts as alive: not ours to judge."""
    if owner.host != socket.gethostname():
        return True
    if owner.pid is None:
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if owner.started is None:
        return True  # recorded before start times were: the pid alone decides
    started = process_started(owner.pid)
    return started is None or started == owner.started


@dataclass(frozen=True)
class Scratch:
    """``<scratch_root>/<backend>-<session>-<random>/`` holding ``session``, ``home``, ``tmp`` and ``run``."""

    root: Path

    @property
    def parent(self) -> Path:
        return self.root.parent

    @property
    def session(self) -> Path:
        return self.root / "session"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @classmethod
    def create(
        cls, session_id: str, backend: str, scratch_root: Path | None = None, node_id: str | None = None
    ) -> Scratch:
        parent = scratch_root or default_scratch_root()
        parent.mkdir(parents=True, exist_ok=True)
        # Others may enter but not list: a session cannot find another's directory by name.
        parent.chmod(0o711)
        root = Path(tempfile.mkdtemp(prefix=f"{backend}-{_safe(session_id)}-", dir=parent))  # mode 0700
        scratch = cls(root)
        for sub in (scratch.session, scratch.home, scratch.tmp, scratch.run):
            sub.mkdir(mode=0o700)
        me = this_process()
        owner = {"pid": me.pid, "host": me.host, "started": me.started, "session_id": session_id, "backend": backend,
                 "node_id": node_id, "created": time.time()}  # fmt: skip
        (root / OWNER_FILE).write_text(json.dumps(owner))
        return scratch

    @classmethod
    def for_session(cls, context: RuntimeContext, backend: str) -> Scratch:
        """The scratch dirs of the session ``context`` describes, labelled with its node."""
        return cls.create(context.session_id, backend, context.scratch_root, context.node_id)

    def remove(self) -> None:
        remove_tree(self.root)


def remove_tree(path: Path) -> None:
    """``rm -rf``: a file, a link or a tree, also when a command cleared the write bits inside it."""

    def make_writable_and_retry(func: object, failed: str, _exc: object) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if path.is_symlink() or path.is_file():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    if not path.exists():
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable_and_retry)
    else:  # onerror is deprecated from 3.12 on
        shutil.rmtree(path, onerror=make_writable_and_retry)


def scratch_leftovers(backend: str, scratch_root: Path | None = None, node_id: str | None = None) -> list[Leftover]:
    """Every scratch root of ``backend`` under ``scratch_root`` (of ``node_id`` only, when given), from its owner
    file (one that cannot be read has no owner: its maker is gone)."""
    parent = scratch_root or default_scratch_root()
    found: list[Leftover] = []
    if not parent.is_dir():
        return found
    for root in sorted(parent.glob(f"{backend}-*")):
        try:
            owner: dict[str, Any] = json.loads((root / OWNER_FILE).read_text())
            created = float(owner.get("created") or (root / OWNER_FILE).stat().st_mtime)
        except (OSError, ValueError, TypeError, AttributeError):
            owner, created = {}, _mtime(root)
        node = owner.get("node_id")
        if node_id is not None and node != node_id:
            continue
        pid, started = owner.get("pid"), owner.get("started")
        found.append(Leftover(
            runtime=backend, kind="scratch", name=str(root), session_id=str(owner.get("session_id") or ""),
            node_id=node if isinstance(node, str) else None,
            owner=Owner(host=str(owner.get("host") or ""), pid=pid if isinstance(pid, int) else None,
                        started=started if isinstance(started, int) else None),
            created=created, scratch=root,
        ))  # fmt: skip
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
