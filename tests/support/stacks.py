"""What a hung event loop was doing, for a test's failure message."""

from __future__ import annotations

import asyncio
import io


def task_stacks(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every task's stack on ``loop`` (the running one when None), as they are now."""
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        task.print_stack(file=out)
    return out.getvalue()
