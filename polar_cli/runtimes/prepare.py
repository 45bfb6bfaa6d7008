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


async def run_prepare(
    handle: RuntimeHandle, actions: Sequence[PrepareAction], *, base_dir: Path | None = None
) -> list[ExecResult]:
    """Run ``actions`` in order; the first failure raises RuntimeFailure (bad actions raise ConfigError).

    - ``exec``: ``command`` is the task author's own shell text, run as ``/bin/sh -c command`` (cwd: ``path`` or the
      session dir; ``timeout_seconds`` or 600 s).
    - ``write_file``: ``content`` to ``path``.
    - ``upload``: the host ``source`` (relative to ``base_dir``, e.g. the task file's folder) to ``path`` (default: the
      session dir under the source's name).

    Relative runtime paths are relative to ``handle.session_path``. Returns the results of the ``exec`` actions.
    """
    results = []
    for index, action in enumerate(actions):
        where = f"prepare[{index}] ({action.type})"
        if action.type == "exec":
            if not action.command:
                raise ConfigError(f"{where}: needs 'command'")
            timeout = action.timeout_seconds or DEFAULT_PREPARE_TIMEOUT
            cwd = _remote(handle, action.path) if action.path else None
            result = await handle.exec(["/bin/sh", "-c", action.command], cwd=cwd, timeout=timeout)
            if result.timed_out:
                raise RuntimeFailure(f"{where} timed out after {timeout:g} s: {_tail(result.stderr)}")
            if result.exit_code != 0:
                raise RuntimeFailure(f"{where} exited {result.exit_code}: {_tail(result.stderr or result.stdout)}")
            results.append(result)
        elif action.type == "write_file":
            if not action.path or action.content is None:
                raise ConfigError(f"{where}: needs 'path' and 'content'")
            await handle.write_file(_remote(handle, action.path), action.content)
        else:
            if not action.source:
                raise ConfigError(f"{where}: needs 'source'")
            source = Path(action.source)
            if not source.is_absolute() and base_dir is not None:
                source = base_dir / source
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
