"""Host processes in their own process group, and the output queue every runtime process uses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from polar_cli.errors import RuntimeFailure
from polar_cli.interfaces.runtime import KILL_GRACE_SECONDS, RuntimeProcess, Stream

POLL_SECONDS = 0.05


class OutputQueue:
    """Chunks from several producers, ended once every producer closed."""

    def __init__(self, producers: int) -> None:
        self._queue: asyncio.Queue[tuple[Stream, bytes] | None] = asyncio.Queue()
        self._open = producers

    def put(self, stream: Stream, chunk: bytes) -> None:
        self._queue.put_nowait((stream, chunk))

    def close(self) -> None:
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[tuple[Stream, bytes]]:
        while self._open:
            item = await self._queue.get()
            if item is None:
                self._open -= 1
                continue
            yield item


def _running_in_group(pgid: int) -> bool:
    """Whether a non-zombie process of group ``pgid`` exists (orphaned zombies may wait long for init to reap)."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
    return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _running_in_group(pgid) if os.path.isdir("/proc/self") else True


async def kill_group(pgid: int, grace: float) -> None:
    """SIGTERM the process group, wait up to ``grace`` for it to vanish, then SIGKILL what is left."""
    if grace > 0:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and group_alive(pgid):
            await asyncio.sleep(POLL_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


class HostProcess(RuntimeProcess):
    """An asyncio subprocess started with ``start_new_session=True``: its pid is its process group id."""

    def __init__(self, process: asyncio.subprocess.Process, stdin: bytes | None) -> None:
        self.process = process
        self.pgid = process.pid
        self._queue = OutputQueue(2)
        self._tasks = [
            asyncio.create_task(self._read("stdout", process.stdout)),
            asyncio.create_task(self._read("stderr", process.stderr)),
        ]
        if stdin is not None:
            self._tasks.append(asyncio.create_task(self._feed(stdin)))
        self.before_terminate: Callable[[float], Awaitable[None]] | None = None

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | str,
        stdin: bytes | None = None,
    ) -> HostProcess:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise RuntimeFailure(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        return cls(process, stdin)

    async def _read(self, stream: Stream, reader: asyncio.StreamReader | None) -> None:
        try:
            while reader is not None:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                self._queue.put(stream, chunk)
        finally:
            self._queue.close()

    async def _feed(self, data: bytes) -> None:
        writer = self.process.stdin
        assert writer is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            writer.write(data)
            await writer.drain()
        writer.close()

    def output(self) -> AsyncIterator[tuple[Stream, bytes]]:
        return self._queue.__aiter__()

    async def wait(self) -> int:
        return await self.process.wait()

    async def terminate(self, grace: float = KILL_GRACE_SECONDS) -> None:
        if self.before_terminate is not None:
            with contextlib.suppress(Exception):
                await self.before_terminate(grace)
        await kill_group(self.pgid, grace)
