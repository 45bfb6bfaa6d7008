"""Prepare actions (shared by every runtime) and the one-call session start the gateway uses."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import ExecResult, RuntimeContext, RuntimeHandle
from polar_cli.models.task import PrepareAction, RuntimeSpec

DEFAULT_PREPARE_TIMEOUT = 600.0


def _tail(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _remote(handle: RuntimeHandle, path: str) -> str:
    return path if posixpath.isabs(path) else posixpath.join(handle.session_path, path)


FIELDS = {
    "exec": ({"command"}, {"command", "path", "timeout_seconds"}),
    "write_file": ({"path", "content"}, {"path", "content"}),
    "upload": ({"source"}, {"source", "path"}),
}
"""Per action type: the fields it needs, and the fields it may set."""


def check_prepare(actions: Sequence[PrepareAction], *, base_dir: Path | None = None) -> None:
    """ConfigError naming the action and field when an action lacks what its type needs, sets a field its type does
    not use, or (``upload``) names a host path outside the task's base dir (an absolute path, ``..`` above it, a
    symlink out of it)."""
    for index, action in enumerate(actions):
        where = f"prepare[{index}] ({action.type})"
        needed, allowed = FIELDS[action.type]
        given = {name for name in action.model_fields_set if name != "type" and getattr(action, name) is not None}
        missing = sorted(n for n in needed if getattr(action, n) is None or (n != "content" and not getattr(action, n)))
        if missing:
            raise ConfigError(f"{where}: needs {', '.join(repr(m) for m in missing)}")
        unused = sorted(given - allowed)
        if unused:
            raise ConfigError(f"{where}: {', '.join(repr(u) for u in unused)} does not apply to {action.type!r}")
        if action.type == "upload":
            upload_source(action, base_dir, where)


def upload_source(action: PrepareAction, base_dir: Path | None, where: str) -> Path | None:
    """The host path an ``upload`` reads (``None`` while no base dir is known); ConfigError outside the base dir."""
    source = str(action.source)
    normal = posixpath.normpath(source.replace("\\", "/"))
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
        raise ConfigError(f"{where}: source {source!r} must be a path inside the task's folder (relative, no '..')")
    if base_dir is None:
        return None
    root = base_dir.resolve()
    path = (root / normal).resolve()
    if path != root and root not in path.parents:
        raise ConfigError(f"{where}: source {source!r} leads outside the task's folder {root}")
    return path


async def run_prepare(
    handle: RuntimeHandle, actions: Sequence[PrepareAction], *, base_dir: Path | None = None
) -> list[ExecResult]:
    """Run ``actions`` in order; the first failure raises RuntimeFailure (bad actions raise ConfigError, see
    :func:`check_prepare`).

    - ``exec``: ``command`` is the task author's own shell text, run as ``/bin/sh -c command`` (cwd: ``path`` or the
      session dir; ``timeout_seconds`` or 600 s).
    - ``write_file``: ``content`` to ``path``.
    - ``upload``: ``source``, a path relative to ``base_dir`` (the task file's folder; a task without one, e.g. one
      submitted over HTTP, cannot upload), to ``path`` (default: the session dir under the source's name).

    Relative runtime paths are relative to ``handle.session_path``. Returns the results of the ``exec`` actions.
    """
    check_prepare(actions, base_dir=base_dir)
    results = []
    for index, action in enumerate(actions):
        where = f"prepare[{index}] ({action.type})"
        if action.type == "exec":
            command = str(action.command)
            timeout = action.timeout_seconds or DEFAULT_PREPARE_TIMEOUT
            cwd = _remote(handle, action.path) if action.path else None
            result = await handle.exec(["/bin/sh", "-c", command], cwd=cwd, timeout=timeout)
            if result.timed_out:
                raise RuntimeFailure(f"{where} timed out after {timeout:g} s: {_tail(result.stderr)}")
            if result.exit_code != 0:
                raise RuntimeFailure(f"{where} exited {result.exit_code}: {_tail(result.stderr or result.stdout)}")
            results.append(result)
        elif action.type == "write_file":
            await handle.write_file(_remote(handle, str(action.path)), str(action.content))
        else:
            source = upload_source(action, base_dir, where)
            if source is None:
                raise ConfigError(f"{where}: this task has no folder to upload {action.source!r} from")
            if not source.exists():
                raise ConfigError(f"{where}: source {source} does not exist")
            await handle.upload(source, _remote(handle, action.path or source.name))
    return results


async def start_session(spec: RuntimeSpec, context: RuntimeContext, *, base_dir: Path | None = None) -> RuntimeHandle:
    """Start ``spec.backend`` for one session and run its prepare actions; on any failure nothing is left behind."""
    from polar_cli.registry import get_runtime

    handle = await get_runtime(spec.backend).start(spec, context)
    try:
        await run_prepare(handle, spec.prepare, base_dir=base_dir)
    except BaseException:
        await handle.cancel()
        raise
    return handle
