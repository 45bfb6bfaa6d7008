"""Durable session results: each SessionResult is on disk (atomically, fsynced) before anyone is told."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from polar_cli.errors import SessionError
from polar_cli.ids import is_session_id
from polar_cli.models import SessionResult


class ResultStore:
    """``<root>/<session_id>.json``, one file per session, written with temp file + fsync + ``os.replace``.

    A reader sees either no file or a complete one; after :meth:`write` returns the result survives a crash.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, session_id: str) -> Path:
        if not is_session_id(session_id):  # no path separators, no hidden files
            raise SessionError(f"invalid session id {session_id!r}")
        return self.root / f"{session_id}.json"

    def write(self, result: SessionResult) -> Path:
        """Write ``result`` durably (blocking: call it in a thread from async code)."""
        target = self.path(result.session_id)
        self.root.mkdir(parents=True, exist_ok=True)
        data = result.model_dump_json().encode()
        fd, temp = tempfile.mkstemp(prefix=f".{result.session_id}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        fsync_path(self.root)  # the rename itself must survive a crash too
        return target

    def read(self, session_id: str) -> SessionResult:
        path = self.path(session_id)
        try:
            return SessionResult.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise SessionError(f"no result for session {session_id!r}") from None

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).is_file()

    def session_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json") if not p.name.startswith("."))


def fsync_path(path: Path) -> None:
    """Flush a file or a folder (its entries: a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
