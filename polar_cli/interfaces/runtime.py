"""Runtime interface: an isolated place where a session's harness runs.

A :class:`Runtime` (a registered plugin) is a factory: ``await runtime.start(spec, context)`` returns a
:class:`RuntimeHandle` for one session. Everything the session starts lives in that handle and dies with it
(``stop()`` gracefully, ``cancel()`` at once); both leave no process, container or temporary directory behind.

Paths. Inside every runtime the session directory is at :attr:`RuntimeHandle.session_path` (``/polar/session`` for
container runtimes), the private home at :attr:`RuntimeHandle.home_path`, the read-only tools (node and the
Polar-managed npm prefix) at :attr:`RuntimeHandle.tools_path`. The ``local`` runtime runs on the host, so there those
attributes are host paths; its file operations and ``cwd`` also accept the fixed ``/polar/...`` forms and translate a
leading one (command arguments are never rewritten: build them from the handle's attributes). Every command also sees
``POLAR_SESSION_DIR`` (= ``session_path``), ``POLAR_SESSION_ID`` and ``HOME`` (= ``home_path``).

Commands are argv lists, never shell strings. Environment, lowest precedence first: the runtime's clean base (PATH,
LANG, TERM), ``RuntimeContext.env`` (gateway URL and key), ``RuntimeSpec.env``, the ``POLAR_*``/``HOME`` variables,
then the per-call ``env``.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ValidationError

from polar_cli.aio import cancel_and_wait, within
from polar_cli.errors import RuntimeFailure
from polar_cli.interfaces.base import Component
from polar_cli.models.base import describe_config_keys_error

if TYPE_CHECKING:
    from polar_cli.models.task import RuntimeSpec

SESSION_PATH = "/polar/session"
HOME_PATH = "/polar/home"
TOOLS_PATH = "/polar/tools"
RUN_PATH = "/polar/run"  # container runtimes' control dir (pid, stdin, exec server files), not for harnesses

Stream = Literal["stdout", "stderr"]
OutputCallback = Callable[[Stream, bytes], None]

KILL_GRACE_SECONDS = 5.0  # SIGTERM, then SIGKILL after this long
DRAIN_SECONDS = 2.0  # after the command exits, how long to wait for output still held open by its children
OUTPUT_LIMIT = 32 * 1024 * 1024  # bytes kept per stream by exec(); older output is dropped (use on_output to keep all)


@dataclass(frozen=True)
class RuntimeContext:
    """What the gateway tells a runtime about one session."""

    session_id: str
    env: Mapping[str, str] = field(default_factory=dict)
    """Injected into every command (the gateway base URL and per-session key)."""
    tools_dir: Path | None = None
    """Host directory with ``bin/node`` and the Polar-managed npm prefix, mounted read-only at ``tools_path``."""
    scratch_root: Path | None = None
    """Where the per-session host directories are made (default: ``$TMPDIR/polar-runtime-<uid>``)."""
    node_id: str | None = None
    """The gateway node that starts the session: every container, directory and process it makes carries it, so the
    node's next start (and ``polar runtimes gc``) finds what a crash left behind."""


@dataclass(frozen=True)
class Owner:
    """The process that made something: its host, pid and start time (clock ticks since boot, from
    ``/proc/<pid>/stat``), so that a recycled pid is never taken for it."""

    host: str
    pid: int | None
    started: int | None = None


@dataclass(frozen=True)
class Leftover:
    """Something a runtime made for one session on this host (a container, an instance, a scratch dir), as a sweep
    finds it: what it is, whose it is and since when. :meth:`Runtime.leftovers` lists them, live or not."""

    runtime: str
    kind: Literal["container", "scratch"]
    name: str
    """The container's name, or the scratch dir's path."""
    session_id: str
    node_id: str | None
    """The ``polar.node`` label (None: made before nodes were labelled, or outside a gateway)."""
    owner: Owner
    created: float
    """When it was made (Unix time)."""
    ref: str = ""
    """The runtime's own handle on it (a container id)."""
    scratch: Path | None = None
    """Its host dirs, removed with it."""


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. ``exit_code`` is negative (-signal) when the local process died of a signal."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class RuntimeProcess(ABC):
    """A command running inside a runtime, started by :meth:`RuntimeHandle.spawn`."""

    @abstractmethod
    def output(self) -> AsyncIterator[tuple[Stream, bytes]]:
        """Output chunks as they come; ends when both streams are closed. Iterate once."""

    @abstractmethod
    async def wait(self) -> int:
        """Wait for the command itself to exit and return its exit code."""

    @abstractmethod
    async def terminate(self, grace: float = KILL_GRACE_SECONDS) -> None:
        """Kill the command's whole process group: SIGTERM, then SIGKILL after ``grace`` seconds."""


class RuntimeHandle(ABC):
    """One session's running runtime. Use as ``async with`` to always stop it."""

    session_id: str
    session_dir: Path
    """The session directory on the host (where ``session_path`` maps)."""
    session_path: str
    """The session directory as commands in this runtime see it; the default ``cwd`` unless the spec sets a workdir."""
    home_path: str
    """The session's private HOME as commands see it."""
    tools_path: str | None = None
    """Where ``RuntimeContext.tools_dir`` is visible to commands (its ``bin`` is first on PATH), if given."""
    workdir: str = ""
    """Where commands run when no ``cwd`` is given: ``RuntimeSpec.workdir`` when the spec sets one (the harness
    starts there too), else ``session_path`` (empty here means ``session_path``)."""

    @abstractmethod
    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        long_running: bool = False,
    ) -> RuntimeProcess:
        """Start ``argv`` in the runtime (its own process group; stdin is ``stdin`` or closed).

        ``long_running``: the command may run for the whole session (a harness). Container runtimes run short
        commands through a shared server inside the container (one fork instead of one engine exec); a long-running
        one gets an engine exec of its own, so nothing the agent does to that server can lose track of it."""

    @abstractmethod
    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or directory to ``remote`` (parents are created)."""

    @abstractmethod
    async def download(self, remote: str, local: Path) -> None:
        """Copy a runtime file or directory to the host path ``local`` (parents are created)."""

    @abstractmethod
    async def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` in the runtime (parents are created)."""

    @abstractmethod
    async def cancel(self) -> None:
        """Kill everything the session started now (no grace) and tear down. Idempotent."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop gracefully (SIGTERM, grace, SIGKILL) and tear down. Idempotent."""

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        kill_grace: float = KILL_GRACE_SECONDS,
        long_running: bool = False,
    ) -> ExecResult:
        """Run ``argv`` to completion with a deadline; the long-running form for harnesses.

        On timeout the process group is killed and ``timed_out`` is set. If the awaiting task is cancelled, the
        process group is killed before ``CancelledError`` propagates. ``on_output`` sees every chunk as it arrives.
        ``long_running``: see :meth:`spawn`.
        """
        # passed only when set, so a plugin runtime whose spawn predates it keeps working for every other command
        extra = {"long_running": True} if long_running else {}
        process = await self.spawn(argv, env=env, cwd=cwd, stdin=stdin, **extra)
        buffers: dict[Stream, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

        async def pump() -> None:
            async for stream, chunk in process.output():
                if on_output is not None:
                    on_output(stream, chunk)
                buffer = buffers[stream]
                buffer += chunk
                if len(buffer) > OUTPUT_LIMIT:
                    del buffer[: len(buffer) - OUTPUT_LIMIT]

        reader = asyncio.create_task(pump())
        timed_out = False
        try:
            try:
                exit_code = await within(process.wait(), timeout)
            except TimeoutError:
                timed_out = True
                await process.terminate(kill_grace)
                try:
                    exit_code = await within(process.wait(), kill_grace + DRAIN_SECONDS)
                except TimeoutError:
                    exit_code = -9  # could not be confirmed dead; stop()/cancel() will take the rest down
            with contextlib.suppress(TimeoutError):
                await within(asyncio.shield(reader), DRAIN_SECONDS)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(process.terminate(0.0))
            raise
        finally:
            if not reader.done():
                with contextlib.suppress(Exception):
                    await cancel_and_wait(reader)
        return ExecResult(
            exit_code=exit_code,
            stdout=buffers["stdout"].decode("utf-8", errors="replace"),
            stderr=buffers["stderr"].decode("utf-8", errors="replace"),
            timed_out=timed_out,
        )

    async def checkpoint(self, keep: Sequence[str] = ()) -> None:
        """Record the sandbox as it is now (prepare done, no session yet): the state :meth:`restore` returns to.

        ``keep``: runtime paths restore leaves alone (a git repository, which the caller resets with git). Runtimes
        that cannot restore (``Runtime.can_restore`` false) raise RuntimeFailure."""
        raise RuntimeFailure(f"session {self.session_id}: this runtime cannot restore a sandbox")

    async def restore(self) -> None:
        """Back to the :meth:`checkpoint`: kill every process started since, remove every file added since outside
        ``keep``. RuntimeFailure when that cannot be done (e.g. a file that existed at the checkpoint was changed or
        deleted): the caller then destroys the sandbox."""
        raise RuntimeFailure(f"session {self.session_id}: this runtime cannot restore a sandbox")

    async def __aenter__(self) -> RuntimeHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class Runtime(Component):
    """A runtime backend (local process, Docker, Apptainer, ...): a factory of per-session handles."""

    kind: ClassVar[str] = "runtime"
    can_restore: ClassVar[bool] = False
    """Whether its handles implement :meth:`RuntimeHandle.checkpoint` and :meth:`RuntimeHandle.restore` (what
    ``runtime.reuse: reset`` needs)."""

    def check_spec(self, spec: RuntimeSpec) -> Any:
        """``spec.config`` parsed as :attr:`options`; ConfigError naming the field when ``spec`` is not one this
        runtime can start. Called when a task is submitted, possibly on another machine: check the spec, not the
        host. Override to check the spec's other fields, then return ``super().check_spec(spec)``."""
        return self.parse_config(spec.config)

    def describe_config_error(self, exc: ValidationError) -> str:
        """In the words of ``runtime.config`` keys: ``unknown config x (known: ...)``, ``config pull must be ...``."""
        return describe_config_keys_error(exc, self.options)

    @abstractmethod
    async def start(self, spec: RuntimeSpec, context: RuntimeContext) -> RuntimeHandle:
        """Start one session's isolated environment and return its handle (prepare actions are not run here)."""

    async def leftovers(self, scratch_root: Path | None = None, node_id: str | None = None) -> list[Leftover]:
        """Everything of this runtime's sessions on this host (of ``node_id`` only, when given), live or not: the
        caller (``polar_cli.runtimes.gc``) decides what goes. RuntimeFailure when it cannot look (no engine)."""
        return []

    async def remove_leftover(self, leftover: Leftover) -> None:
        """Kill what ``leftover`` still runs and remove it with its host dirs (nothing there is an error)."""
