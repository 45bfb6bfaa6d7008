"""The per-session journal: one JSONL file per session, one Completion per line, flushed as each is captured."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import orjson

from polar_cli.errors import ProxyError
from polar_cli.models import Completion


def journal_path(journal_dir: Path, session_id: str) -> Path:
    return journal_dir / f"{session_id}.jsonl"


class Journal:
    """An append-only JSONL file. ``append`` writes and flushes one line (the OS has it before the answer goes out)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - held open for the session's lifetime
        except OSError as exc:
            raise ProxyError(f"cannot open journal {path}: {exc.strerror or exc}") from exc

    def existing_lines(self) -> int:
        """Records already in the file (a session re-created after a restart continues its numbering)."""
        with open(self.path, "rb") as fh:
            return sum(1 for line in fh if line.strip())

    def append(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            raise ProxyError(f"journal {self.path} is closed")
        try:
            self._fh.write(orjson.dumps(record) + b"\n")
            self._fh.flush()
        except OSError as exc:
            raise ProxyError(f"cannot write journal {self.path}: {exc.strerror or exc}") from exc

    def read_raw(self) -> list[bytes]:
        """The records as raw JSON lines, in order."""
        with open(self.path, "rb") as fh:
            return [line.rstrip(b"\n") for line in fh if line.strip()]

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_journal(path: str | Path) -> list[Completion]:
    """Every Completion in a journal file, in capture order (validated)."""
    try:
        with open(path, "rb") as fh:
            return [Completion.model_validate(orjson.loads(line)) for line in fh if line.strip()]
    except OSError as exc:
        raise ProxyError(f"cannot read journal {path}: {exc.strerror or exc}") from exc
