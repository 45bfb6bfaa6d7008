"""The rollout server's data dir on disk: its database files, and the per-session files of the gateway embedded
beside it (role ``all``: ``results/<session>.json`` and ``journal/<session>.jsonl``), measured and removed for
retention. A gateway on another host keeps its own files (``polar_cli.gateway``): the server never reaches them."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from polar_cli.models import DiskUsage

DB_SUFFIXES = ("", "-wal", "-shm")


@dataclass(frozen=True)
class SessionFiles:
    """Where an embedded gateway keeps each session's result and journal."""

    results_dir: Path
    journal_dir: Path

    def paths(self, session_id: str) -> list[Path]:
        """The session's files (a journal whose torn last line was set aside has ``.torn-N`` files beside it)."""
        journal = self.journal_dir / f"{session_id}.jsonl"
        paths = [self.results_dir / f"{session_id}.json", journal]
        n = 1
        while (torn := journal.with_name(f"{journal.name}.torn-{n}")).exists():
            paths.append(torn)
            n += 1
        return paths

    def size(self, session_ids: list[str]) -> int:
        return sum(_size(path) for session_id in session_ids for path in self.paths(session_id))

    def remove(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            for path in self.paths(session_id):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def folder_bytes(folder: Path) -> int:
    """The bytes of the files in ``folder`` and below (0 when it does not exist)."""
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    total += folder_bytes(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def measure(db_path: Path, db_bytes: tuple[int, int, int], files: SessionFiles | None) -> DiskUsage:
    """The data dir now (blocking: it lists the results and journal folders). ``db_bytes``: the bytes of the task
    bodies and results stored, of the database's free pages, and of its pages (``SQLiteStore.db_bytes``)."""
    db = sum(_size(db_path.with_name(db_path.name + suffix)) for suffix in DB_SUFFIXES)
    data, free, _ = db_bytes
    results = 0 if files is None else folder_bytes(files.results_dir)
    journal = 0 if files is None else folder_bytes(files.journal_dir)
    return DiskUsage(
        measured_at=time.time(),
        db_bytes=db,
        db_free_bytes=free,
        results_bytes=results,
        journal_bytes=journal,
        total_bytes=db + results + journal,
        data_bytes=data,
        kept_bytes=data + results + journal,
    )
