"""Warm sandbox pools and reuse: started sandboxes (prepare done) that a session's INIT takes instead of starting one.

One pool per :class:`SandboxRecipe` key: everything that makes a sandbox what it is (the whole ``RuntimeSpec``:
backend, image, prepare, env, mounts, network, cpus, memory, config, reuse policy; the harness's tools dir; the task
folder ``upload`` reads from). A background loop keeps ``clamp(sessions of the key waiting for INIT, min, max)``
sandboxes per key ready, at most ``parallel`` starts and resets at once, stops those above the floor idle for
``idle_seconds`` (a key unused that long shrinks to nothing) and :meth:`SandboxPool.close` stops them all.

A pooled sandbox starts before its session is known, under a pool id (``pool-<hex>``: its container name, labels,
scratch dir and ``POLAR_SESSION_ID`` at start); :class:`SessionSandbox` lends it to one session, every command of
which sees the session's own ``POLAR_SESSION_ID``. The gateway URL and key never reach a sandbox at start: the
harness gets them per command. After the session (:meth:`SandboxPool.release`) the sandbox is destroyed, or, with
``runtime.reuse: reset`` and a session that ended well, reset (``polar_cli.runtimes.reset``) and put back; a
failed reset destroys it. With reuse a key never holds more than ``max`` sandboxes, lent ones included: at the
ceiling a session waits for one being reset. Evaluation sandboxes (``acquire(..., evaluation=True)``) only ever get
a fresh one, and are never put back.

With ``max: 0`` (the default) there is no pool: every session starts its own sandbox under its own id, as without
this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt, model_validator

from polar_cli.aio import wait_event
from polar_cli.errors import PolarError, RuntimeFailure
from polar_cli.interfaces.runtime import RuntimeContext, RuntimeHandle, RuntimeProcess
from polar_cli.models import StrictModel
from polar_cli.models.limits import MAX_RUN_SLOTS
from polar_cli.models.task import RuntimeSpec
from polar_cli.runtimes.prepare import start_session
from polar_cli.runtimes.reset import Checkpoint, checkpoint_sandbox, reset_sandbox

log = logging.getLogger(__name__)

POOL_ID_PREFIX = "pool-"


class SandboxPoolConfig(StrictModel):
    """``pipeline.sandbox_pool``: warm sandboxes per runtime spec, and where reused ones wait."""

    max: int = Field(default=0, ge=0, le=MAX_RUN_SLOTS, description="ceiling of ready sandboxes per spec; 0: no pool")
    min: int = Field(default=0, ge=0, le=MAX_RUN_SLOTS, description="floor of ready sandboxes per spec in use")
    parallel: PositiveInt = Field(default=4, le=MAX_RUN_SLOTS, description="sandbox starts and resets at once")
    idle_seconds: float = Field(
        default=300.0, gt=0, description="a ready sandbox above the floor idle this long is stopped; a spec no "
        "session used this long shrinks to none",
    )  # fmt: skip

    @model_validator(mode="after")
    def _floor(self) -> SandboxPoolConfig:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


@dataclass(frozen=True)
class SandboxRecipe:
    """How to start one kind of sandbox: the runtime spec and what the session's context adds to it."""

    spec: RuntimeSpec
    tools_dir: Path | None = None
    base_dir: Path | None = None
    scratch_root: Path | None = None
    node_id: str | None = None
    """The gateway node its sandboxes are labelled with (``RuntimeContext.node_id``)."""

    @property
    def key(self) -> str:
        parts = [self.spec.model_dump(mode="json"), *(str(p) if p else None for p in self.paths)]
        return json.dumps(parts, sort_keys=True)

    @property
    def paths(self) -> tuple[Path | None, ...]:
        return self.tools_dir, self.base_dir, self.scratch_root

    def context(self, session_id: str) -> RuntimeContext:
        return RuntimeContext(session_id, tools_dir=self.tools_dir, scratch_root=self.scratch_root,
                              node_id=self.node_id)  # fmt: skip


@dataclass(eq=False)
class Sandbox:
    """One pooled sandbox."""

    handle: RuntimeHandle
    recipe: SandboxRecipe
    checkpoint: Checkpoint | None
    started: float = field(default_factory=time.monotonic)
    idle_since: float = field(default_factory=time.monotonic)
    sessions: int = 0
    """Sessions it was lent to (an evaluation counts)."""
    resets: int = 0


@dataclass
class PoolStats:
    """Counters since the pool started."""

    hits: int = 0
    misses: int = 0
    started: int = 0
    start_failures: int = 0
    resets_ok: int = 0
    resets_failed: int = 0
    destroyed: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class SessionSandbox(RuntimeHandle):
    """A pooled sandbox lent to one session: its commands see the session's ``POLAR_SESSION_ID``; ``stop()`` and
    ``cancel()`` destroy it (only :meth:`SandboxPool.release` with ``reuse`` puts it back)."""

    def __init__(self, pool: SandboxPool, sandbox: Sandbox, session_id: str, *, evaluation: bool) -> None:
        inner = sandbox.handle
        self.pool = pool
        self.sandbox = sandbox
        self.evaluation = evaluation
        self.released = False
        self.session_id = session_id
        self.session_dir = inner.session_dir
        self.session_path = inner.session_path
        self.home_path = inner.home_path
        self.tools_path = inner.tools_path
        self.workdir = inner.workdir

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        long_running: bool = False,
    ) -> RuntimeProcess:
        if self.released:
            raise RuntimeFailure(f"session {self.session_id}: its sandbox was already released")
        session_env = {"POLAR_SESSION_ID": self.session_id, **(env or {})}
        extra = {"long_running": True} if long_running else {}  # a plugin runtime's spawn may not take the flag
        return await self.sandbox.handle.spawn(argv, env=session_env, cwd=cwd, stdin=stdin, **extra)

    async def upload(self, local: Path, remote: str) -> None:
        await self.sandbox.handle.upload(local, remote)

    async def download(self, remote: str, local: Path) -> None:
        await self.sandbox.handle.download(remote, local)

    async def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644) -> None:
        await self.sandbox.handle.write_file(path, content, mode=mode)

    async def cancel(self) -> None:
        await self.pool.release(self, reuse=False, immediate=True)

    async def stop(self) -> None:
        await self.pool.release(self, reuse=False)


class SandboxPool:
    """The gateway's warm sandboxes. ``demand()`` names a recipe per session waiting for INIT (what sizes the pool).

    Use as ``async with SandboxPool(config, demand=...) as pool:``; ``await pool.acquire(recipe, session_id)`` in
    INIT, ``await pool.release(handle, reuse=...)`` at teardown."""

    def __init__(
        self, config: SandboxPoolConfig | None = None, *, demand: Callable[[], Iterable[SandboxRecipe]] | None = None
    ) -> None:
        self.config = config or SandboxPoolConfig()
        self.demand = demand or (lambda: ())
        self.stats = PoolStats()
        self._idle: dict[str, list[Sandbox]] = {}
        self._recipes: dict[str, SandboxRecipe] = {}
        self._last_used: dict[str, float] = {}
        self._coming: Counter[str] = Counter()
        """Per key: sandboxes starting for the pool or being reset (each will be ready, or fail)."""
        self._lent: Counter[str] = Counter()
        """Per key (``reuse: reset`` only): sandboxes lent to sessions, each coming back after its reset or not."""
        self._waiters: dict[str, list[asyncio.Future[Sandbox | None]]] = {}
        self._slots = asyncio.Semaphore(self.config.parallel)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._closing = False
        self._live: set[Sandbox] = set()
        """Every sandbox started and not yet destroyed: ready, lent or being reset."""

    @property
    def enabled(self) -> bool:
        return self.config.max > 0

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.enabled and self._loop is None:
            self._loop = asyncio.create_task(self._maintain(), name="polar-sandbox-pool")

    async def close(self) -> None:
        """Stop refilling, wait for resets under way, stop every sandbox the pool holds."""
        self._closing = True
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        idle = [s for sandboxes in self._idle.values() for s in sandboxes]
        self._idle.clear()
        await asyncio.gather(*(self._destroy(s, immediate=True) for s in idle), return_exceptions=True)
        await asyncio.gather(*list(self._stopping), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def snapshot(self) -> dict[str, Any]:
        """Counters and the sandboxes ready now (``GatewayMetrics``, ``polar status``)."""
        ready = sum(len(s) for s in self._idle.values())
        return {**self.stats.as_dict(), "ready": ready, "coming": sum(self._coming.values())}

    def held(self) -> list[str]:
        """The pool ids of every sandbox the pool holds (ready, lent to a session or being reset): labels that the
        gateway's TTL sweep must leave alone."""
        return [sandbox.handle.session_id for sandbox in self._live]

    def ready(self, recipe: SandboxRecipe) -> int:
        return len(self._idle.get(recipe.key, []))

    def prewarm(self, recipe: SandboxRecipe) -> None:
        """Fill ``recipe``'s floor now, before a session asks for one (a known workload, a benchmark)."""
        key = recipe.key
        self._recipes[key] = recipe
        self._last_used[key] = time.monotonic()
        self._wake.set()

    # ---- lending ------------------------------------------------------------------------------------------------

    async def acquire(self, recipe: SandboxRecipe, session_id: str, *, evaluation: bool = False) -> RuntimeHandle:
        """A started sandbox (prepare done) for ``session_id``: a ready one, one about to be, or a new one."""
        if not self.enabled:
            return await start_session(recipe.spec, recipe.context(session_id), base_dir=recipe.base_dir)
        key = recipe.key
        self._recipes[key] = recipe
        self._last_used[key] = time.monotonic()
        sandbox = self._take(key, fresh_only=evaluation)
        if sandbox is None and not evaluation and self._worth_waiting(recipe):
            waiter: asyncio.Future[Sandbox | None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(waiter)
            try:
                sandbox = await waiter
            except asyncio.CancelledError:
                got = waiter.result() if waiter.done() and not waiter.cancelled() else None
                if got is not None and not self._put(got, key):  # handed over as this INIT was cancelled
                    self._spawn(self._destroy(got, immediate=True))
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters[key].remove(waiter)
        if sandbox is None:
            self.stats.misses += 1
            sandbox = await self._start(recipe)
        else:
            self.stats.hits += 1
        sandbox.sessions += 1
        if not evaluation and recipe.spec.reuse == "reset":
            self._lent[key] += 1
        self._wake.set()
        return SessionSandbox(self, sandbox, session_id, evaluation=evaluation)

    async def release(self, handle: RuntimeHandle, *, reuse: bool, immediate: bool = False) -> None:
        """After the session: reset and put back (``reuse`` and the spec allows it), else destroy. Idempotent."""
        if not isinstance(handle, SessionSandbox):
            await (handle.cancel() if immediate else handle.stop())
            return
        if handle.released:
            return
        handle.released = True
        sandbox = handle.sandbox
        key = sandbox.recipe.key
        counted = not handle.evaluation and sandbox.recipe.spec.reuse == "reset"
        if counted:
            self._lent[key] -= 1
        if reuse and not immediate and not handle.evaluation and self._reusable(sandbox):
            self._coming[key] += 1
            self._spawn(self._reset(sandbox, key))
        else:
            if counted:
                self._arrival_failed(key)  # a session waiting for this one starts its own
            await self._destroy(sandbox, immediate=immediate)

    def _held(self, key: str, reuse: bool) -> int:
        """Sandboxes of ``key`` that exist or will: ready, starting or resetting, and (reuse) lent out."""
        return len(self._idle.get(key, [])) + self._coming[key] + (self._lent[key] if reuse else 0)

    def _worth_waiting(self, recipe: SandboxRecipe) -> bool:
        """Whether a session that found no ready sandbox should wait for one rather than start its own: one is
        about to be ready for it, or (``reuse: reset``) the key holds its ceiling and a lent one will come back."""
        key = recipe.key
        waiting = len(self._waiters.get(key, []))
        if self._coming[key] > waiting:
            return True
        reuse = recipe.spec.reuse == "reset"
        return reuse and self._coming[key] + self._lent[key] > waiting and self._held(key, reuse) >= self.config.max

    def _reusable(self, sandbox: Sandbox) -> bool:
        spec = sandbox.recipe.spec
        return (
            not self._closing
            and spec.reuse == "reset"
            and sandbox.checkpoint is not None
            and sandbox.sessions < spec.reuse_max_sessions
            and time.monotonic() - sandbox.started < spec.reuse_max_seconds
        )

    def _take(self, key: str, *, fresh_only: bool) -> Sandbox | None:
        idle = self._idle.get(key, [])
        for index in range(len(idle) - 1, -1, -1):  # the most recently ready first; used ones before fresh ones
            if not fresh_only and idle[index].sessions:
                return idle.pop(index)
        for index in range(len(idle) - 1, -1, -1):
            if not idle[index].sessions:
                return idle.pop(index)
        return None

    def _put(self, sandbox: Sandbox, key: str) -> bool:
        """Hand a ready sandbox to a waiting session, or keep it; False when the pool is full (or closing)."""
        for waiter in self._waiters.get(key, []):
            if not waiter.done():
                waiter.set_result(sandbox)
                return True
        idle = self._idle.setdefault(key, [])
        if self._closing or len(idle) >= self.config.max:
            return False
        sandbox.idle_since = time.monotonic()
        idle.append(sandbox)
        return True

    def _arrival_failed(self, key: str) -> None:
        """A sandbox this key was waiting for will not come: one waiter starts its own."""
        for waiter in self._waiters.get(key, []):
            if not waiter.done():
                waiter.set_result(None)
                return

    # ---- starting, resetting, destroying ------------------------------------------------------------------------

    async def _start(self, recipe: SandboxRecipe) -> Sandbox:
        """Start a sandbox under a pool id and (``reuse: reset``) record its checkpoint."""
        pool_id = f"{POOL_ID_PREFIX}{secrets.token_hex(6)}"
        try:
            handle = await start_session(recipe.spec, recipe.context(pool_id), base_dir=recipe.base_dir)
        except BaseException:
            self.stats.start_failures += 1
            raise
        try:
            checkpoint = await checkpoint_sandbox(handle, recipe.spec) if recipe.spec.reuse == "reset" else None
        except BaseException:
            self.stats.start_failures += 1
            await handle.cancel()
            raise
        self.stats.started += 1
        sandbox = Sandbox(handle, recipe, checkpoint)
        self._live.add(sandbox)
        return sandbox

    async def _refill(self, recipe: SandboxRecipe, key: str) -> None:
        try:
            async with self._slots:
                sandbox = await self._start(recipe)
        except BaseException as exc:
            self._coming[key] -= 1
            self._arrival_failed(key)
            if not isinstance(exc, asyncio.CancelledError):
                log.warning("sandbox pool: a sandbox could not start: %s", exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._coming[key] -= 1
        if not self._put(sandbox, key):
            await self._destroy(sandbox, immediate=True)

    async def _reset(self, sandbox: Sandbox, key: str) -> None:
        try:
            async with self._slots:
                await reset_sandbox(sandbox.handle, sandbox.recipe.spec, sandbox.checkpoint or Checkpoint())
        except BaseException as exc:
            self._coming[key] -= 1
            self._arrival_failed(key)
            if not isinstance(exc, asyncio.CancelledError):
                log.warning("sandbox pool: reset failed, sandbox destroyed: %s", exc)
            await self._destroy(sandbox, immediate=True)
            self.stats.resets_failed += 1  # counted once the sandbox is gone
            if not isinstance(exc, Exception):
                raise
            return
        self._coming[key] -= 1
        self.stats.resets_ok += 1
        sandbox.resets += 1
        if not self._put(sandbox, key):
            await self._destroy(sandbox, immediate=True)

    async def _destroy(self, sandbox: Sandbox, *, immediate: bool) -> None:
        stop = asyncio.create_task(sandbox.handle.cancel() if immediate else sandbox.handle.stop())
        self._stopping.add(stop)  # close() waits for it: a cancelled caller does not leave the sandbox half-stopped
        stop.add_done_callback(self._stopping.discard)
        try:
            await asyncio.shield(stop)
        except PolarError as exc:  # what is left of it is no longer held: the gateway's TTL sweep removes it
            log.warning("sandbox pool: a sandbox did not stop cleanly: %s", exc)
        finally:
            self._live.discard(sandbox)
        self.stats.destroyed += 1

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._wake.set())

    # ---- sizing -------------------------------------------------------------------------------------------------

    async def _maintain(self) -> None:
        tick = min(1.0, self.config.idle_seconds / 4)
        while True:
            await wait_event(self._wake, tick)
            self._wake.clear()
            try:
                self.resize()
            except Exception:  # a bad demand reading must not stop the pool
                log.exception("sandbox pool: resize failed")

    def targets(self) -> dict[str, int]:
        """Ready sandboxes wanted per key now: the sessions waiting for INIT, within [min, max]; none for a key no
        session used for ``idle_seconds``."""
        now = time.monotonic()
        waiting: Counter[str] = Counter()
        for recipe in self.demand():
            key = recipe.key
            self._recipes.setdefault(key, recipe)
            self._last_used[key] = now  # a session waits for it: in use
            waiting[key] += 1
        targets = {}
        for key in self._recipes:
            active = now - self._last_used.get(key, now) < self.config.idle_seconds
            targets[key] = max(self.config.min, min(waiting[key], self.config.max)) if active else 0
        return targets

    def resize(self) -> None:
        """Start what is missing (bounded by ``parallel``) and stop what idled too long above the target."""
        now = time.monotonic()
        for key, target in self.targets().items():
            idle = self._idle.get(key, [])
            missing = target - len(idle) - self._coming[key] + len(self._waiters.get(key, []))
            reuse = self._recipes[key].spec.reuse == "reset"
            if reuse:  # lent sandboxes come back: the key never holds more than its ceiling
                missing = min(missing, self.config.max - self._held(key, reuse))
            for _ in range(max(0, missing)):
                self._coming[key] += 1
                self._spawn(self._refill(self._recipes[key], key))
            extra = len(idle) - target
            if extra > 0:
                stale = [s for s in idle if now - s.idle_since >= self.config.idle_seconds][:extra]
                for sandbox in stale:
                    idle.remove(sandbox)
                    self._spawn(self._destroy(sandbox, immediate=True))
            if (
                not idle
                and not self._coming[key]
                and not self._lent[key]
                and not target
                and key not in self._waiters_for()
            ):
                self._forget(key)

    def _waiters_for(self) -> set[str]:
        return {key for key, waiters in self._waiters.items() if waiters}

    def _forget(self, key: str) -> None:
        self._idle.pop(key, None)
        self._recipes.pop(key, None)
        self._last_used.pop(key, None)
        self._waiters.pop(key, None)
        self._coming.pop(key, None)
        self._lent.pop(key, None)
