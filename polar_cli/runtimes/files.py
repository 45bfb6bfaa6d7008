"""Host-side file copies shared by the runtimes (blocking work runs in a thread)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from polar_cli.errors import RuntimeFailure


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


async def copy_path(source: Path, target: Path) -> None:
    """Copy a file or directory tree, creating ``target``'s parents; OSError becomes RuntimeFailure."""
    try:
        await asyncio.to_thread(_copy, source, target)
    except OSError as exc:
        raise RuntimeFailure(f"cannot copy {source} to {target}: {exc.strerror or exc}") from exc


def _write(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(target, mode)


async def write_bytes(target: Path, content: str | bytes, mode: int = 0o644) -> None:
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        await asyncio.to_thread(_write, target, data, mode)
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {target}: {exc.strerror or exc}") from exc


def under(path: str, base: str) -> str | None:
    """The part of the absolute ``path`` below ``base`` ('' for ``base`` itself), or None when it is elsewhere."""
    normalized = os.path.normpath(path)
    if normalized == base:
        return ""
    if normalized.startswith(base + "/"):
        return normalized[len(base) + 1 :]
    return None
