"""The per-session journal: one JSONL file per session, one Completion per line, flushed as each is captured.

The proxy appends with ``append_async``: the record is serialized on the event loop, then written and flushed in a
worker thread (the write of a 32K-token record, ~0.5 MB, is most of the proxy's per-call cost and releases the GIL),
and the answer goes to the harness only once the OS has the line. Appends of one journal are written one at a time, in
the order they were called, so lines stay in capture order. Flushing hands the line to the OS: it survives a crash of
the proxy process, not a power loss (no fsync per call).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import IO, Any

import orjson

from polar_cli.errors import ProxyError
from polar_cli.models import Completion


def journal_path(journal_dir: Path, session_id: str) -> Path:
    return journal_dir / f"{session_id}.jsonl"


class Journal:
    """An append-only JSONL file. ``append_async`` writes and flushes one line (the OS has it before the answer goes
    out)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: asyncio.Lock | None = None  # created on first async use, inside the event loop
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - held open for the session's lifetime
        except OSError as exc:
            raise ProxyError(f"cannot open journal {path}: {exc.strerror or exc}") from exc

    def existing_lines(self) -> int:
        """Records already in the file (a session re-created after a restart continues its numbering)."""
        with open(self.path, "rb") as fh:
            return sum(1 for line in fh if line.strip())

    async def append_async(self, record: dict[str, Any]) -> None:
        """Append one record: written and flushed in a worker thread; returns once the OS has the line."""
        line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # FIFO: lines land in the order append_async was called
            await asyncio.to_thread(self._write, line)

    async def aclose(self) -> None:
        """Close once the appends already under way are written."""
        if self._lock is None:
            self.close()
            return
        async with self._lock:
            self.close()

    def _write(self, line: bytes) -> None:
        if self._fh is None:
            raise ProxyError(f"journal {self.path} is closed")
        try:
            self._fh.write(line)
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
