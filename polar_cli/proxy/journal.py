"""The per-session journal: one JSONL file per session, one Completion per line, flushed as each is captured.

Guarantees (see docs/proxy.md, "Journal"):

- The proxy appends with ``append_async``: the record is serialized on the event loop, then written and flushed, and
  the answer goes to the harness only once the OS has the line. A line of up to :data:`INLINE_BYTES` is written on
  the event loop when nothing else is being written (handing it to a thread costs more than the write); a larger one,
  any while another write is under way, and every line for :data:`OFFLOAD_S` after a write on the loop took over
  :data:`SLOW_WRITE_S` (a disk under writeback pressure must not stall every session) is written in a worker thread.
  Appends of one journal are written one at a time, in call order. Flushing hands the line to the OS: it survives a
  crash of the proxy process, not a power loss (no fsync per call).
- A write that fails part-way is cut back off, so the next line never glues onto a partial one.
- Opening a journal repairs a torn last line (a crash or power loss during a write): every complete line stays, the
  torn bytes move to ``<session>.jsonl.torn-<n>`` and a warning is logged. A complete record that only lost its
  newline is kept.
- ``next_index`` is the largest index on disk + 1, so a session re-created after a restart never reuses an id, even
  when earlier calls left gaps.
- Readers skip a line that is not a record (and log it) instead of failing the whole session; a last line still
  being written (no newline yet) is not read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, ClassVar

import orjson
from pydantic import ValidationError

from polar_cli.errors import ProxyError
from polar_cli.models import Completion

log = logging.getLogger("polar.proxy.journal")

INLINE_BYTES = 1 << 20
"""The largest line written on the event loop (when no other write is under way): a page-cache write of a 32K-token
call's record (~0.5 MB) takes about 0.1 ms, as long as a worker thread's round trip, which on a busy machine can take
far longer (the thread has to be scheduled)."""
SLOW_WRITE_S = 0.05
"""A write on the event loop that took longer than this sends the writes of the next OFFLOAD_S seconds to threads.
Writeback throttling stalls a write for tens to hundreds of milliseconds; a busy CPU preempts one for a few."""
OFFLOAD_S = 10.0

# the head of every record the proxy writes (capture.completion_record's key order): read the index without parsing
_HEAD = re.compile(rb'\{"completion_id":"[^"\\]*","session_id":"[^"\\]*","index":(\d+),')


def journal_path(journal_dir: Path, session_id: str) -> Path:
    return journal_dir / f"{session_id}.jsonl"


def _record_index(line: bytes) -> int | None:
    """The index of a journal line, or None when the line is not a record."""
    head = _HEAD.match(line)
    if head is not None and line.endswith(b"}"):
        return int(head.group(1))
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    index = data.get("index") if isinstance(data, dict) else None
    return index if type(index) is int and index >= 0 else None


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or type(data.get("index")) is not int:
        return None
    if not isinstance(data.get("completion_id"), str):
        return None
    return data


def _complete_lines(raw: bytes) -> list[tuple[int, bytes]]:
    """(line number, line) of every newline-terminated, non-blank line; a last line without newline is left out."""
    lines = raw.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line still being written
    return [(n, line) for n, line in enumerate(lines, 1) if line.strip()]


def _good_lines(numbered: Iterable[tuple[int, bytes]], source: str | Path) -> list[bytes]:
    out = []
    for number, line in numbered:
        if _parse_record(line) is None:
            log.warning("journal %s: line %d is not a completion record; skipped (%d bytes)", source, number, len(line))
            continue
        out.append(line)
    return out


def _torn_path(path: Path) -> Path:
    n = 1
    while True:
        candidate = path.with_name(f"{path.name}.torn-{n}")
        if not candidate.exists():
            return candidate
        n += 1


def repair(path: Path) -> Path | None:
    """Cut a torn last line off ``path`` (kept aside as ``<name>.torn-<n>``); returns where it went, or None."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size == 0:
                return None
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return None
            # walk back to the last newline (a record can be megabytes: read in blocks)
            end = size
            cut = 0
            while end > 0:
                start = max(0, end - (1 << 16))
                fh.seek(start)
                block = fh.read(end - start)
                at = block.rfind(b"\n")
                if at >= 0:
                    cut = start + at + 1
                    break
                end = start
            fh.seek(cut)
            tail = fh.read()
    except OSError as exc:
        raise ProxyError(f"cannot read journal {path}: {exc.strerror or exc}") from exc
    try:
        if _parse_record(tail) is not None:  # a whole record that lost only its newline
            with open(path, "ab") as fh:
                fh.write(b"\n")
            log.warning("journal %s: the last record had no newline; completed it", path)
            return None
        aside = _torn_path(path)
        aside.write_bytes(tail)
        os.truncate(path, cut)
    except OSError as exc:
        raise ProxyError(f"cannot repair journal {path}: {exc.strerror or exc}") from exc
    log.warning("journal %s: torn last line (%d bytes) moved to %s; %d bytes of complete lines kept", path, len(tail),
                aside, cut)  # fmt: skip
    return aside


class Journal:
    """An append-only JSONL file. ``append_async`` writes and flushes one line (the OS has it before the answer goes
    out). Opening it repairs a torn last line and finds the next free index."""

    _threaded: ClassVar[int] = 0
    """Writes under way in worker threads, over every journal of the process: while one is (a slow disk, a big line),
    small lines go to threads too, so the event loop never waits on the disk behind it."""
    _offload_until: ClassVar[float] = 0.0
    """Until this ``time.monotonic()``, every write goes to a thread: a write on the loop was slow (SLOW_WRITE_S)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: asyncio.Lock | None = None  # created on first async use, inside the event loop
        self._queued = 0  # appends of this journal waiting for or holding the lock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                repair(path)
            self._fh: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - held open for the session's lifetime
        except OSError as exc:
            raise ProxyError(f"cannot open journal {path}: {exc.strerror or exc}") from exc
        self.next_index = self._scan_next_index()

    def _scan_next_index(self) -> int:
        """The largest index on disk + 1 (0 for a new journal): ids stay unique across restarts and gaps."""
        highest = -1
        with open(self.path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                line = line.rstrip(b"\n")
                if not line.strip():
                    continue
                index = _record_index(line)
                if index is None:
                    log.warning("journal %s: line %d is not a completion record; skipped", self.path, number)
                elif index > highest:
                    highest = index
        return highest + 1

    async def append_async(self, record: dict[str, Any]) -> int:
        """Append one record: written and flushed (on the event loop when small and nothing else is being written,
        else in a worker thread); returns (its size in bytes) once the OS has the line."""
        line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        if len(line) <= INLINE_BYTES and not self._queued and not Journal._threaded:
            began = time.monotonic()
            if began >= Journal._offload_until:
                self._write(line)  # nothing of this journal is queued: call order is kept
                took = time.monotonic() - began
                if took > SLOW_WRITE_S:
                    Journal._offload_until = began + took + OFFLOAD_S
                    log.warning("journal %s: a %d-byte write took %.0f ms; writing in worker threads for %g s",
                                self.path, len(line), took * 1000, OFFLOAD_S)  # fmt: skip
                return len(line)
        if self._lock is None:
            self._lock = asyncio.Lock()
        self._queued += 1
        try:
            async with self._lock:  # FIFO: lines land in the order append_async was called
                Journal._threaded += 1
                try:
                    await asyncio.to_thread(self._write, line)
                finally:
                    Journal._threaded -= 1
        finally:
            self._queued -= 1
        return len(line)

    async def aclose(self) -> None:
        """Close once the appends already under way are written."""
        if self._lock is None:
            self.close()
            return
        async with self._lock:
            self.close()

    def _write(self, line: bytes) -> None:
        fh = self._fh
        if fh is None:
            raise ProxyError(f"journal {self.path} is closed")
        start = fh.tell()
        try:
            fh.write(line)
            fh.flush()
        except OSError as exc:
            # a partial line would glue the next record onto it: cut the file back to where this line began
            try:
                fh.seek(start)
                fh.truncate(start)
            except (OSError, ValueError):
                log.exception("journal %s: could not cut back a failed write", self.path)
            raise ProxyError(f"cannot write journal {self.path}: {exc.strerror or exc}") from exc

    def read_raw(self) -> list[bytes]:
        """The records as raw JSON lines, in order; lines that are not records are skipped (and logged)."""
        return read_raw(self.path)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_raw(path: str | Path) -> list[bytes]:
    """Every complete record line of a journal file, in order; bad lines are skipped and logged."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ProxyError(f"cannot read journal {path}: {exc.strerror or exc}") from exc
    return _good_lines(_complete_lines(raw), path)


def validate_lines(lines: Iterable[bytes], source: str | Path) -> list[Completion]:
    """Completions from JSON lines; a line that is not a valid Completion is skipped and logged."""
    out = []
    for number, line in enumerate(lines, 1):
        try:
            out.append(Completion.model_validate(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            log.warning("journal %s: record %d is not a valid Completion; skipped: %s", source, number,
                        str(exc).splitlines()[0])  # fmt: skip
    return out


def read_journal(path: str | Path) -> list[Completion]:
    """Every Completion in a journal file, in capture order (validated; bad lines skipped and logged)."""
    return validate_lines(read_raw(path), path)
