"""What the built-in runtimes share: a handle over one session's scratch dirs, shut down once, and the listing and
removal of those dirs for the sweeps of ``polar_cli.runtimes.gc``.

:class:`ScratchHandle` owns the shutdown: ``stop()`` (SIGTERM, grace, SIGKILL) and ``cancel()`` (at once) both run
:meth:`ScratchHandle.release` once, then remove the scratch dirs whatever happened. :class:`ScratchRuntime` lists the
scratch dirs named after the runtime as leftovers; removing one releases what it still runs
(:meth:`ScratchRuntime.release_leftover`), then deletes it.
"""

from __future__ import annotations

import asyncio
import posixpath
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path

from polar_cli.errors import RuntimeFailure
from polar_cli.interfaces.runtime import KILL_GRACE_SECONDS, Leftover, Runtime, RuntimeHandle
from polar_cli.runtimes.checkpoint import DirSnapshot, shown
from polar_cli.runtimes.process import HostProcess
from polar_cli.runtimes.scratch import Scratch, remove_tree, scratch_leftovers


class ScratchHandle(RuntimeHandle):
    """A session's handle whose host side is one :class:`Scratch` (session, home, tmp and run dirs)."""

    def __init__(self, scratch: Scratch, session_id: str) -> None:
        self.session_id = session_id
        self.scratch = scratch
        self.session_dir = scratch.session
        self.closed = False
        self.kept: tuple[str, ...] = ()
        """Runtime paths the checkpoint leaves out (a git repository reset by git)."""
        self.snapshot: DirSnapshot | None = None

    def check_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as a list, refused when the handle is closed or it is not a non-empty list of strings."""
        if self.closed:
            raise RuntimeFailure(f"session {self.session_id}: runtime already stopped")
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise RuntimeFailure("a command is a non-empty list of strings (never a shell string)")
        return list(argv)

    @abstractmethod
    async def release(self, grace: float) -> None:
        """Kill everything the session started (SIGTERM, then SIGKILL after ``grace`` seconds; SIGKILL at once when
        ``grace`` is 0) and release its container or instance. Called once."""

    # ---- checkpoint and restore (reuse: reset) ---------------------------------------------------------------

    def host_of(self, path: str) -> Path | None:
        """Where a runtime path lives on the host, when it is inside the session's scratch dirs."""
        return None

    async def checkpoint(self, keep: Sequence[str] = ()) -> None:
        self.kept = tuple(posixpath.normpath(k) for k in keep)
        host_keep = [h for h in (self.host_of(k) for k in self.kept) if h is not None]
        roots = (self.scratch.session, self.scratch.home, self.scratch.tmp)
        self.snapshot = await asyncio.to_thread(DirSnapshot.take, roots, host_keep)
        await self.checkpoint_inside()

    async def restore(self) -> None:
        if self.snapshot is None:
            raise RuntimeFailure(f"session {self.session_id}: restore without a checkpoint")
        await self.kill_since_checkpoint()
        changes = await asyncio.to_thread(self.snapshot.changes)
        if changes.changed:
            raise RuntimeFailure(f"changed since the checkpoint: {shown(changes.changed)}")
        await self.remove_added([Path(p) for p in changes.added])
        await self.restore_inside()
        await asyncio.to_thread(_empty, self.scratch.run)  # control files of the session's commands
        left = await asyncio.to_thread(self.snapshot.changes)
        if left.added or left.changed:
            raise RuntimeFailure(f"still differs from the checkpoint: {shown(left.added + left.changed)}")

    async def checkpoint_inside(self) -> None:
        """Record what lives outside the scratch dirs (processes, a container's rootfs)."""

    async def kill_since_checkpoint(self) -> None:
        """Kill every process started since the checkpoint; RuntimeFailure if one survives."""

    async def remove_added(self, paths: Sequence[Path]) -> None:
        """Remove host paths under the scratch dirs that a session added."""
        for path in paths:
            await asyncio.to_thread(remove_tree, path)

    async def restore_inside(self) -> None:
        """Undo what the session added outside the scratch dirs; RuntimeFailure when something cannot be undone."""

    async def remove_scratch(self) -> None:
        """Remove the session's host dirs (after :meth:`release`, whether or not it succeeded)."""
        await asyncio.to_thread(self.scratch.remove)

    async def _shutdown(self, grace: float) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self.release(grace)
        finally:
            await self.remove_scratch()

    async def cancel(self) -> None:
        await self._shutdown(0.0)

    async def stop(self) -> None:
        await self._shutdown(KILL_GRACE_SECONDS)


async def terminate_all(processes: Sequence[HostProcess], grace: float) -> None:
    """Terminate every host process still running, all at once (one failing does not stop the others)."""
    live = [p for p in processes if p.process.returncode is None]
    await asyncio.gather(*(p.terminate(grace) for p in live), return_exceptions=True)


def _empty(directory: Path) -> None:
    for entry in directory.iterdir():
        remove_tree(entry)


class ScratchRuntime(Runtime):
    """A runtime whose sessions each live in a :class:`Scratch` named after the runtime."""

    async def release_leftover(self, root: Path) -> None:
        """Stop what a dead session left running under the scratch dir ``root`` (its dir is removed next)."""

    async def leftovers(self, scratch_root: Path | None = None, node_id: str | None = None) -> list[Leftover]:
        return await asyncio.to_thread(scratch_leftovers, self.name, scratch_root, node_id)

    async def remove_leftover(self, leftover: Leftover) -> None:
        if leftover.scratch is not None:
            await self.release_leftover(leftover.scratch)
            await asyncio.to_thread(remove_tree, leftover.scratch)
