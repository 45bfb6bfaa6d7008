"""Sweeps of what sessions' runtimes left behind: containers, scratch dirs and the processes they still run.

Every runtime lists what its sessions made on this host (:meth:`Runtime.leftovers`), each with its gateway node
(``polar.node``), the process that made it (host, pid, start time) and when. A :class:`GcRule` picks what goes:

- a thing whose maker is gone (not running any more, or its pid now another process's) goes, unless the rule keeps
  it: another node's (``node_id``), too young (``older_than_s``), or, with ``spare_live_nodes``, of a node that still
  has a live maker somewhere;
- a thing this very process made goes only when the rule names the sessions it holds (``held``, a gateway's TTL
  sweep) and its session is not among them;
- a thing a live process on this host made, or any thing made on another host, is never touched.

The gateway's start-up and TTL sweeps (``polar_cli.gateway.sweeps``) and ``polar runtimes gc`` call
:func:`collect_garbage`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polar_cli.errors import PolarError
from polar_cli.interfaces.runtime import Leftover
from polar_cli.registry import get_registry, get_runtime
from polar_cli.runtimes.scratch import is_this_process, owner_alive

REMOVALS_AT_ONCE = 8


@dataclass(frozen=True)
class GcRule:
    """Which leftovers a sweep removes (see the module docstring)."""

    node_id: str | None = None
    """Only things labelled with this node id."""
    older_than_s: float | None = None
    """Only things made at least this many seconds ago."""
    held: frozenset[str] | None = None
    """A gateway's own sweep: the session ids its live sessions hold; this process's things of other sessions go."""
    spare_live_nodes: bool = False
    """Keep every thing of a node that has a thing whose maker still runs (a live gateway's)."""

    def reason(self, item: Leftover, now: float, live_nodes: frozenset[str]) -> str | None:
        """Why ``item`` goes, or None when it stays."""
        if self.node_id is not None and item.node_id != self.node_id:
            return None
        if self.older_than_s is not None and now - item.created < self.older_than_s:
            return None
        if is_this_process(item.owner):
            if self.held is None or item.session_id in self.held:
                return None
            return "no session of this gateway holds it"
        if owner_alive(item.owner):
            return None
        if self.spare_live_nodes and item.node_id in live_nodes:
            return None
        return f"its maker (pid {item.owner.pid} on {item.owner.host or '?'}) is gone"


@dataclass(frozen=True)
class Removal:
    """One leftover a sweep picked, why, and the error that kept it from going (None: it went)."""

    leftover: Leftover
    reason: str
    error: str | None = None


@dataclass
class GcReport:
    """What a sweep removed (or, ``dry_run``, would remove), failed to remove, and the runtimes it could not list."""

    dry_run: bool = False
    removed: list[Removal] = field(default_factory=list)
    failed: list[Removal] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Runtime name -> why its leftovers could not be listed (no Docker Engine, ...)."""


def live_nodes(items: Sequence[Leftover]) -> frozenset[str]:
    """The nodes with a thing whose maker still runs."""
    return frozenset(item.node_id for item in items if item.node_id is not None and owner_alive(item.owner))


async def find_garbage(
    rule: GcRule, *, runtimes: Sequence[str] | None = None, scratch_root: Path | None = None
) -> tuple[list[Removal], dict[str, str]]:
    """What ``rule`` picks among the leftovers of ``runtimes`` (default: every registered one), and the runtimes
    that could not be looked at, with why."""
    names = list(runtimes) if runtimes is not None else get_registry().names("runtime")
    found: list[Leftover] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            found += await get_runtime(name).leftovers(scratch_root, rule.node_id)
        except PolarError as exc:  # e.g. no Docker Engine here: nothing of it to sweep
            skipped[name] = str(exc)
    now, live = time.time(), live_nodes(found)
    picked = []
    for item in found:
        why = rule.reason(item, now, live)
        if why is not None:
            picked.append(Removal(item, why))
    return picked, skipped


async def collect_garbage(
    rule: GcRule,
    *,
    runtimes: Sequence[str] | None = None,
    scratch_root: Path | None = None,
    dry_run: bool = False,
) -> GcReport:
    """Remove what ``rule`` picks (nothing with ``dry_run``: the report lists what would go)."""
    picked, skipped = await find_garbage(rule, runtimes=runtimes, scratch_root=scratch_root)
    report = GcReport(dry_run=dry_run, skipped=skipped)
    if dry_run:
        report.removed = picked
        return report
    limit = asyncio.Semaphore(REMOVALS_AT_ONCE)

    async def remove(removal: Removal) -> Removal:
        async with limit:
            try:
                await get_runtime(removal.leftover.runtime).remove_leftover(removal.leftover)
            except (PolarError, OSError) as exc:
                return Removal(removal.leftover, removal.reason, error=str(exc) or type(exc).__name__)
        return removal

    for done in await asyncio.gather(*(remove(removal) for removal in picked)):
        (report.failed if done.error is not None else report.removed).append(done)
    return report
