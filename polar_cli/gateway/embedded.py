"""``polar run``'s gateway: one node started for one task, its sessions run, the node closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import SessionResult, TaskRequest

ProgressCallback = Callable[[dict[str, Any], list[SessionResult]], None]


async def run_embedded(
    task: TaskRequest,
    config: GatewayConfig,
    *,
    base_dir: Path | None = None,
    on_progress: ProgressCallback | None = None,
    on_ready: Callable[[GatewayNode], None] | None = None,
    interval: float = 0.2,
) -> list[SessionResult]:
    """Run every session of ``task`` on a gateway node started for it (``polar run``); results in sample order.

    ``on_ready(node)`` is called once it listens (``node.url``; its control routes need ``config.control_token``);
    ``on_progress(metrics, finished_results)`` is called every ``interval`` seconds and once at the end (also when
    cancelled, with every session's result once the node has cancelled them).
    """
    async with GatewayNode(config, base_dir=base_dir) as node:
        if on_ready is not None:
            on_ready(node)
        jobs = await node.submit_task(task)
        waiting = asyncio.gather(*(node.pipeline.wait(job.session_id) for job in jobs))
        try:
            while not waiting.done():
                if on_progress is not None:
                    on_progress(node.pipeline.metrics(), [job.result for job in jobs if job.result is not None])
                await asyncio.wait({waiting}, timeout=interval)
        except BaseException:  # cancelled (Ctrl-C, SIGTERM): each session is cancelled and still gets its result
            waiting.cancel()
            await node.close()
            if on_progress is not None:
                on_progress(node.pipeline.metrics(), [job.result for job in jobs if job.result is not None])
            raise
        results = waiting.result()
        if on_progress is not None:
            on_progress(node.pipeline.metrics(), results)
        return results
