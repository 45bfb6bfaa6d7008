"""A gateway node's sweeps of what runtimes left behind (``GatewayConfig.runtime_gc``).

- At start, before the node takes a session: everything labelled with its node id whose maker is gone (an earlier
  run of this node, killed or crashed: its containers, scratch dirs and the processes they still run).
- Every ``interval_seconds``: the node's things older than ``ttl_seconds`` whose maker is gone, or that this process
  made and no live session of it holds (a teardown that failed).

``polar_cli.runtimes.gc`` decides what goes; this module schedules the sweeps and logs each removal (a warning:
``polar serve`` always says it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from polar_cli.aio import cancel_and_wait
from polar_cli.gateway.config import RuntimeGcConfig
from polar_cli.runtimes.gc import GcReport, GcRule, collect_garbage

log = logging.getLogger(__name__)


def local_node_id(data_dir: Path) -> str:
    """The node id of a gateway that no rollout server names (``polar run``): the same for every run on a data dir,
    so a restart on it sweeps what a killed run left."""
    return "local-" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


class RuntimeSweeps:
    """``await sweeps.at_start()`` before the node takes sessions, ``sweeps.start()`` for the TTL sweep,
    ``await sweeps.close()`` to stop it. ``node_id()`` and ``held()`` (the session ids live here) are read at each
    sweep."""

    def __init__(
        self,
        config: RuntimeGcConfig,
        *,
        node_id: Callable[[], str],
        held: Callable[[], Iterable[str]],
        scratch_root: Path | None = None,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.held = held
        self.scratch_root = scratch_root
        self._loop: asyncio.Task[None] | None = None

    async def at_start(self) -> GcReport | None:
        """Remove what an earlier run of this node left behind (None when ``at_start`` is off, or the sweep failed:
        that is logged, and the node starts all the same)."""
        if not self.config.at_start:
            return None
        try:
            return await self._sweep(GcRule(node_id=self.node_id()), "at start")
        except Exception as exc:  # leftovers cost disk, not correctness: never a reason not to serve
            log.warning("runtime sweep (at start) of node %s failed: %s", self.node_id(), exc)
            return None

    async def ttl_sweep(self) -> GcReport:
        """Remove this node's things older than the TTL that no live session here holds."""
        rule = GcRule(node_id=self.node_id(), older_than_s=self.config.ttl_seconds, held=frozenset(self.held()))
        return await self._sweep(rule, f"TTL {self.config.ttl_seconds:g} s")

    def start(self) -> None:
        if self.config.interval_seconds is not None and self._loop is None:
            self._loop = asyncio.create_task(self._every(self.config.interval_seconds), name="polar-runtime-gc")

    async def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            await cancel_and_wait(loop)

    async def _every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.ttl_sweep()
            except Exception as exc:  # a sweep that fails is tried again next time; the node goes on
                log.warning("runtime sweep of node %s failed: %s", self.node_id(), exc)

    async def _sweep(self, rule: GcRule, what: str) -> GcReport:
        report = await collect_garbage(rule, scratch_root=self.scratch_root)
        node = rule.node_id
        for removal in report.removed:
            item = removal.leftover
            log.warning("runtime sweep (%s) of node %s: removed %s %s %s of session %s: %s", what, node, item.runtime,
                        item.kind, item.name, item.session_id or "?", removal.reason)  # fmt: skip
        for removal in report.failed:
            item = removal.leftover
            log.warning("runtime sweep (%s) of node %s: could not remove %s %s %s: %s", what, node, item.runtime,
                        item.kind, item.name, removal.error)  # fmt: skip
        for runtime, why in report.skipped.items():
            log.debug("runtime sweep (%s): %s not looked at: %s", what, runtime, why)
        return report
