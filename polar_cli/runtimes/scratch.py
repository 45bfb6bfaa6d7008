"""Per-session host directories (session, home, tmp, run) and finding the ones a dead process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from polar_cli.ids import id_part

OWNER_FILE = ".owner.json"


def default_scratch_root() -> Path:
    return Path(tempfile.gettempdir()) / f"polar-runtime-{os.getuid()}"


def _safe(text: str) -> str:
    return id_part(text, 40) or "session"


def owner_alive(owner: dict[str, object]) -> bool:
    """Whether the process that made a session still runs (a different host counts as alive: not ours to judge)."""
    if owner.get("host") != socket.gethostname():
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    def create(cls, session_id: str, backend: str, scratch_root: Path | None = None) -> Scratch:
        parent = scratch_root or default_scratch_root()
        parent.mkdir(parents=True, exist_ok=True)
        # Others may enter but not list: a session cannot find another's directory by name.
        parent.chmod(0o711)
        root = Path(tempfile.mkdtemp(prefix=f"{backend}-{_safe(session_id)}-", dir=parent))  # mode 0700
        scratch = cls(root)
        for sub in (scratch.session, scratch.home, scratch.tmp, scratch.run):
            sub.mkdir(mode=0o700)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "session_id": session_id, "backend": backend}
        (root / OWNER_FILE).write_text(json.dumps(owner))
        return scratch

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


def leftovers(backend: str, scratch_root: Path | None = None, *, everything: bool = False) -> list[Path]:
    """Scratch roots of ``backend`` whose owner process is gone (every one with ``everything``)."""
    parent = scratch_root or default_scratch_root()
    found: list[Path] = []
    if not parent.is_dir():
        return found
    for root in sorted(parent.glob(f"{backend}-*")):
        try:
            owner = json.loads((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = {}
        if everything or not owner_alive(owner):
            found.append(root)
    return found
