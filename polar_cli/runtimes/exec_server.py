"""A persistent exec server inside a container: one engine exec per sandbox instead of one per command.

An engine exec (``docker exec``) costs about 50 ms of the engine's own work (runc entering the container's namespaces,
measured by ``bench/tool_exec.py``); a fork inside the container costs about 1 ms. So a container handle starts, on
its first command, one long-lived ``bash`` (:data:`SERVER_SCRIPT`) whose stdin and stdout are the engine exec's
streams, and every later short command is one line to it.

The server is ``bash DIR/server.sh`` (DIR: its control dir under ``/polar/run``). Requests:

- ``r ID``: source the request script ``ID.sh`` (written by the host into the bind-mounted control dir) in a
  background job of its own process group (``set -m``); reply ``p ID PID``, then ``x ID STATUS`` once it exits
  (``wait``'s status: the exit code, or 128+signal).
- ``k SIG PID``: ``kill -s SIG`` the process group ``PID`` (and the pid itself).

The request script (:func:`request_script`) is POSIX shell built from single-quoted words: it points stdout and
stderr at two FIFOs the host made and holds open for reading, stdin at a file or ``/dev/null``, changes to the cwd
(126 when it is missing, as an engine exec), exports the per-call environment and ``exec``s the argv unchanged (127
for a missing command). Nothing of the argv is ever parsed by a shell. The engine exec's stream ending means the
server (or its container) is gone: every command still running is reported as exit 137 and the next request starts
a new server.

The caller keeps an engine exec per command for what the server should not or cannot run: a long-running command
(the harness: nothing the agent does to the server may lose track of it), per-call env names that are not shell
identifiers (:func:`serves`), and images without ``bash``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from polar_cli.aio import within
from polar_cli.errors import RuntimeFailure
from polar_cli.interfaces.runtime import KILL_GRACE_SECONDS, RuntimeProcess, Stream
from polar_cli.runtimes.files import write_bytes
from polar_cli.runtimes.process import OutputQueue

SERVER_SCRIPT = r"""# Polar's exec server (polar_cli/runtimes/exec_server.py); run as: bash DIR/server.sh
d=${0%/*}
run() {
  set -m
  . "$d/$1.sh" &
  local pid=$!
  echo "p $1 $pid"
  wait "$pid"
  echo "x $1 $?"
}
echo ready
while IFS=' ' read -r op a b; do
  case $op in
    r) run "$a" & ;;
    k) kill -s "$a" -- "-$b" 2>/dev/null; kill -s "$a" "$b" 2>/dev/null ;;
  esac
done
"""
LOST_EXIT_CODE = 137  # what a command whose server or container went away reports, as an engine exec's killed one
PID_WAIT_SECONDS = 5.0  # how long terminate() waits for a just-sent request's pid before giving up
FIFOS: tuple[tuple[str, Stream], ...] = ((".out", "stdout"), (".err", "stderr"))
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def serves(env: Mapping[str, str] | None) -> bool:
    """Whether the server can pass ``env`` (``export`` takes shell identifiers only; others go through the engine)."""
    return all(_ENV_NAME.fullmatch(name) for name in env or {})


def request_script(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: str, stdout: str, stderr: str
) -> str:
    """The script the server sources for one command (every word single-quoted: run as given, never re-parsed)."""
    q = shlex.quote
    lines = [
        f"exec >{q(stdout)} 2>{q(stderr)} <{q(stdin)}",
        f"CDPATH= cd -- {q(cwd)} 2>/dev/null || {{ echo {q(f'polar-exec: no directory {cwd}')} >&2; exit 126; }}",
        "unset OLDPWD SHLVL",  # set by bash itself: the command sees the container's environment, as an engine exec
        *(f"export {q(f'{name}={value}')}" for name, value in env.items()),
        "exec -- " + " ".join(q(arg) for arg in argv),
    ]
    return "\n".join(lines) + "\n"


class _Fifo:
    """The host's read end of one output FIFO, fed into an :class:`OutputQueue` by the event loop."""

    def __init__(self, path: Path, stream: Stream, queue: OutputQueue) -> None:
        os.mkfifo(path, 0o600)
        os.chmod(path, 0o666)  # the container's user may be another uid; the control dir's parent is 0700
        self.path = path
        self._stream = stream
        self._queue = queue
        self._loop = asyncio.get_running_loop()
        # A reader opened before any writer sees neither data nor a hang-up until a writer came and went.
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._loop.add_reader(self._fd, self._read)

    def _read(self) -> None:
        if self._fd is None:
            return
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self._queue.put(self._stream, chunk)
        else:
            self.close()

    def nudge(self) -> None:
        """Open and close a writer: the output ends once no other writer holds the FIFO (also when none ever did)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))

    @property
    def open(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is None:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._queue.close()


class ServedProcess(RuntimeProcess):
    """A command run by an :class:`ExecServer`: output from its FIFOs, status and pid from the server's replies."""

    def __init__(self, server: ExecServer, request_id: str, fifos: Callable[[OutputQueue], list[_Fifo]]) -> None:
        self._server = server
        self.request_id = request_id
        self._queue = OutputQueue(2)
        self._fifos = fifos(self._queue)
        loop = asyncio.get_running_loop()
        self.pid: asyncio.Future[int | None] = loop.create_future()
        self.exit: asyncio.Future[int] = loop.create_future()

    def started(self, pid: int | None) -> None:
        if not self.pid.done():
            self.pid.set_result(pid)

    def ended(self, code: int) -> None:
        self.started(None)
        if not self.exit.done():
            self.exit.set_result(code)
        for fifo in self._fifos:
            fifo.nudge()

    @property
    def reading(self) -> bool:
        return any(fifo.open for fifo in self._fifos)

    def close(self) -> None:
        for fifo in self._fifos:
            fifo.close()

    def output(self) -> AsyncIterator[tuple[Stream, bytes]]:
        return self._queue.__aiter__()

    async def wait(self) -> int:
        return await asyncio.shield(self.exit)

    async def terminate(self, grace: float = KILL_GRACE_SECONDS) -> None:
        if self.exit.done() or not self._server.alive:
            return
        try:
            pid = await within(asyncio.shield(self.pid), PID_WAIT_SECONDS)
        except TimeoutError:
            pid = None
        if pid is None:
            return
        for sig, wait_for in (("TERM", grace), ("KILL", KILL_GRACE_SECONDS)):
            if sig == "TERM" and grace <= 0:
                continue
            if not self._server.send(f"k {sig} {pid}"):
                return
            with contextlib.suppress(TimeoutError):
                await within(asyncio.shield(self.exit), wait_for)
            if self.exit.done():
                return


class ExecServer:
    """The host side of one in-container server: requests out through ``write``, replies in through :meth:`feed`.

    ``control``/``remote_control``: the bind-mounted control dir for this server's files, on the host and in the
    container. The transport (an engine exec's stream) calls :meth:`feed` with the server's stdout and
    :meth:`lost` when it ends.
    """

    def __init__(self, control: Path, remote_control: str, write: Callable[[bytes], None]) -> None:
        self.control = control
        self.remote_control = remote_control
        self._write = write
        self._processes: dict[str, ServedProcess] = {}  # running
        self._reading: list[ServedProcess] = []  # whose output may still be open
        self._buffer = b""
        self._counter = 0
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.alive = True

    def send(self, line: str) -> bool:
        """Send one request line; False once the server is gone."""
        if not self.alive:
            return False
        try:
            self._write(line.encode() + b"\n")
        except OSError:
            self.lost()
            return False
        return True

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: bytes | None
    ) -> ServedProcess:
        self._counter += 1
        request_id = str(self._counter)
        host, remote = self.control / request_id, f"{self.remote_control}/{request_id}"
        stdin_path = "/dev/null"
        if stdin is not None:
            await write_bytes(host.with_suffix(".in"), stdin, 0o644)
            stdin_path = remote + ".in"
        script = request_script(argv, env=env, cwd=cwd, stdin=stdin_path, stdout=remote + ".out",
                                stderr=remote + ".err")  # fmt: skip
        await write_bytes(host.with_suffix(".sh"), script, 0o644)
        process = ServedProcess(self, request_id, lambda queue: [
            _Fifo(host.with_suffix(suffix), stream, queue) for suffix, stream in FIFOS])  # fmt: skip
        self._processes[request_id] = process
        self._reading = [p for p in self._reading if p.reading]
        self._reading.append(process)
        if not self.send(f"r {request_id}"):
            process.ended(LOST_EXIT_CODE)
        return process

    def feed(self, data: bytes) -> None:
        """The server's stdout: ``ready``, ``p ID PID`` and ``x ID STATUS`` lines."""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            op, _, rest = line.decode(errors="replace").partition(" ")
            request_id, _, number = rest.partition(" ")
            if op == "ready" and not self.ready.done():
                self.ready.set_result(None)
            process = self._processes.get(request_id)
            if process is None or not number.strip().isdigit():
                continue
            if op == "p":
                process.started(int(number))
            elif op == "x":
                self._finish(request_id, int(number))

    def _finish(self, request_id: str, code: int) -> None:
        process = self._processes.pop(request_id)
        process.ended(code)
        for suffix in (".sh", ".in"):  # normally gone already; left when the script never ran
            with contextlib.suppress(OSError):
                (self.control / request_id).with_suffix(suffix).unlink()

    def lost(self) -> None:
        """The server's stream ended (the server or its container died, or it was closed)."""
        self.alive = False
        if not self.ready.done():
            self.ready.set_exception(RuntimeFailure("the exec server ended before it was ready"))
        for request_id in list(self._processes):
            self._finish(request_id, LOST_EXIT_CODE)

    def close(self) -> None:
        """Stop reading every command's output (the container is going away)."""
        self.lost()
        for process in self._reading:
            process.close()
        self._reading = []


async def await_ready(server: ExecServer, timeout: float) -> None:
    """Wait for the server's ``ready`` line; RuntimeFailure when it ended or did not answer in time."""
    started = time.monotonic()
    try:
        await within(asyncio.shield(server.ready), timeout)
    except TimeoutError as exc:
        raise RuntimeFailure(f"the exec server did not start within {time.monotonic() - started:.0f} s") from exc
