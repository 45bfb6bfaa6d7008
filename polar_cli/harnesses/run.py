"""Running a harness inside a runtime: the one code path the gateway and ``polar doctor`` share."""

from __future__ import annotations

import dataclasses
import posixpath
import time
from collections.abc import Mapping
from typing import Any

from polar_cli.errors import HarnessError
from polar_cli.interfaces.harness import Harness, HarnessContext, HarnessLaunch, HarnessRun
from polar_cli.interfaces.runtime import OutputCallback, RuntimeHandle

STDERR_KEEP = 20_000  # characters of the harness's own stderr kept with a failure


def context_for(
    handle: RuntimeHandle,
    *,
    instruction: str,
    model: str,
    api_key: str,
    base_urls: Mapping[str, str],
    config: Mapping[str, Any] | None = None,
) -> HarnessContext:
    """The harness context for a started runtime: its home, tools path and working directory (the runtime's
    ``workdir``, i.e. ``RuntimeSpec.workdir`` when the task sets one, else the session dir)."""
    return HarnessContext(
        instruction=instruction,
        model=model,
        api_key=api_key,
        base_urls=dict(base_urls),
        home=handle.home_path,
        workdir=handle.workdir or handle.session_path,
        tools=handle.tools_path,
        session_id=handle.session_id,
        config=dict(config or {}),
    )


def _home_file(home: str, relative: str) -> str:
    normalized = posixpath.normpath(relative)
    if posixpath.isabs(relative) or normalized == ".." or normalized.startswith("../"):
        raise HarnessError(f"a harness may only write files inside the session home, not {relative!r}")
    return posixpath.join(home, normalized)


def tail(text: str, limit: int = STDERR_KEEP) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


async def write_files(handle: RuntimeHandle, context: HarnessContext, launch: HarnessLaunch) -> None:
    for relative, content in launch.files.items():
        await handle.write_file(_home_file(context.home, relative), content, mode=0o600)


async def run_harness(
    harness: Harness,
    handle: RuntimeHandle,
    context: HarnessContext,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
    on_output: OutputCallback | None = None,
) -> HarnessRun:
    """Write the harness's files into the session home, run it with a deadline and judge the result.

    ``env`` (e.g. ``AgentSpec.env``) is applied under the adapter's own variables: the adapter's pins (home, base
    URL, key, model, telemetry switches) always win. Cancelling the awaiting task kills the harness's process group.
    """
    launch = harness.launch(context)
    if not launch.argv or not all(isinstance(part, str) for part in launch.argv):
        raise HarnessError(f"harness {harness.name!r} produced an invalid argv: {launch.argv!r}")
    await write_files(handle, context, launch)
    started = time.monotonic()
    result = await handle.exec(
        launch.argv,
        env={**(env or {}), **launch.env},
        cwd=launch.cwd,
        timeout=timeout,
        stdin=launch.stdin,
        on_output=on_output,
        long_running=True,
    )
    run = HarnessRun(
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        timed_out=result.timed_out,
        seconds=time.monotonic() - started,
    )
    failure = harness.check_run(run)
    if failure is None:
        return run
    return dataclasses.replace(run, failure=failure)


def failure_report(harness: Harness, run: HarnessRun) -> str:
    """A failure message with the harness's own stderr attached (the way failures reach users and results)."""
    message = run.failure or "ok"
    stderr = run.stderr.strip()
    return f"{message}\n--- {harness.name} stderr ---\n{tail(stderr)}" if stderr else f"{message} (no stderr)"
