"""The tools directory: node plus a Polar-managed npm prefix, mounted read-only at /polar/tools.

Layout (an npm ``--prefix``): ``bin/node``, ``bin/<cli>`` (npm's relative links into ``lib/node_modules``). Runtimes
put ``<tools>/bin`` first on PATH, so ``#!/usr/bin/env node`` shebangs find this node. A container image then needs
only ``/usr/bin/env``, ``/bin/sh`` and a libc/libstdc++ compatible with the host's node (check with ``ldd``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from polar_cli.errors import RuntimeFailure


def ensure_node(tools_dir: Path, node: Path | None = None) -> Path:
    """Place a real copy (or hard link) of ``node`` (default: the one on PATH) at ``tools_dir/bin/node``.

    A symlink would dangle inside a container, so the binary itself goes in. Returns the path.
    """
    target = tools_dir / "bin" / "node"
    if target.is_file() and not target.is_symlink():
        return target
    found = node or (Path(p) if (p := shutil.which("node")) else None)
    if found is None:
        raise RuntimeFailure("no node binary found on PATH to put in the tools directory")
    source = found.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".node.{os.getpid()}")
    try:
        try:
            os.link(source, partial)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(source, partial)
        os.replace(partial, target)
    except OSError as exc:
        raise RuntimeFailure(f"cannot put node into {target}: {exc.strerror or exc}") from exc
    return target
