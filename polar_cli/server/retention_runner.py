"""Retention at work in the rollout server: at start and every ``interval_s``, the data dir is measured (what
``polar status`` shows) and, when retention is set, the tasks ``polar_cli.server.retention.select`` picks are
compacted or removed, each in its own transaction, their files removed once it has committed."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from polar_cli.models import DiskUsage, RetentionStatus
from polar_cli.server.disk import SessionFiles, measure
from polar_cli.server.retention import Candidate, RetentionConfig, format_size, select
from polar_cli.server.store import SessionStore
from polar_cli.server.store_retention import RetentionCounts, Retired
from polar_cli.server.store_threads import StoreThreads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Planned:
    task_id: str
    file_bytes: int


class RetentionRunner:
    """``await runner.run()`` until cancelled; ``runner.status()`` and ``runner.usage`` for ``GET /rollout/status``."""

    def __init__(
        self,
        config: RetentionConfig,
        store: SessionStore,
        threads: StoreThreads,
        db_path: Path,
        files: SessionFiles | None = None,
    ) -> None:
        self.config, self.store, self.threads = config, store, threads
        self.db_path, self.files = db_path, files
        self.usage: DiskUsage | None = None
        self.counts = RetentionCounts()
        self.last_run_at: float | None = None
        self.note: str | None = None

    async def run(self) -> None:
        """A pass every ``interval_s``; the first at once unless the server ran it before serving (retention set)."""
        if self.last_run_at is None:
            await self.pass_logged()
        while True:
            await asyncio.sleep(self.config.interval_s)
            await self.pass_logged()

    async def pass_logged(self) -> None:
        """:meth:`run_once`; a failed pass (a full disk, a locked file) is logged, and the next one runs as planned."""
        try:
            await self.run_once()
        except Exception:
            log.exception("retention pass failed; trying again in %gs", self.config.interval_s)

    async def run_once(self) -> list[Retired]:
        """Measure, then (retention set) compact or remove what is due; what was retired."""
        self.usage = await self._measure()
        retired: list[Retired] = []
        if self.config.enabled:
            for planned in await self.threads.read(self._plan, self.usage.kept_bytes):
                done = await self.threads.write(self.store.retire, planned.task_id, self.config.mode,
                                                planned.file_bytes)  # fmt: skip
                if done is not None:
                    if self.files is not None:
                        await asyncio.to_thread(self.files.remove, done.session_ids)
                    retired.append(done)
            if retired:
                self.usage = await self._measure()
            self.note = self._over_cap_note(self.usage)
        self.counts = await self.threads.read(self.store.retention_counts)
        self.last_run_at = time.time()
        return retired

    async def _measure(self) -> DiskUsage:
        """The database's counts on a reader thread; the folders' walk on a thread of its own, not holding a reader."""
        db_bytes = await self.threads.read(self.store.db_bytes)
        return await asyncio.to_thread(measure, self.db_path, db_bytes, self.files)

    def _plan(self, kept_bytes: int) -> list[_Planned]:
        files: dict[str, int] = {}

        def size_of(candidate: Candidate) -> int:
            db_bytes, session_ids = self.store.task_data(candidate.task_id)
            files[candidate.task_id] = 0 if self.files is None else self.files.size(session_ids)
            return db_bytes + files[candidate.task_id]

        chosen = select(self.store.retention_candidates(self.config.mode), self.config, now=time.time(),
                        used_bytes=kept_bytes, size_of=size_of)  # fmt: skip
        return [_Planned(selected.task_id, files[selected.task_id]) for selected in chosen]

    def _over_cap_note(self, usage: DiskUsage) -> str | None:
        cap = self.config.max_bytes
        if cap is None or usage.kept_bytes <= cap:
            return None
        compacted = ", or already compacted (mode compact)" if self.config.mode == "compact" else ""
        return (
            f"{format_size(usage.kept_bytes)} kept, over max_bytes {format_size(cap)}: the rest is running or not yet "
            f"acknowledged by a trainer{compacted}"
        )

    def status(self) -> RetentionStatus:
        return RetentionStatus(
            settings=self.config.describe(),
            compacted_tasks=self.counts.compacted_tasks,
            removed_tasks=self.counts.removed_tasks,
            freed_bytes=self.counts.freed_bytes,
            last_run_at=self.last_run_at,
            note=self.note,
        )
