"""Running harnesses in the real local runtime: the instruction runs nothing, failures carry the harness's stderr."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from polar_cli.harnesses.doctor import doctor_proxy
from polar_cli.harnesses.run import context_for, failure_report, run_harness
from polar_cli.harnesses.testing import in_ci, missing_cli_reason
from polar_cli.interfaces.harness import HarnessRun
from polar_cli.interfaces.runtime import RuntimeContext
from polar_cli.models.task import RuntimeSpec
from polar_cli.registry import get_harness, get_runtime

NASTY = (
    "--help \"double\" 'single' $(touch pwned-1) `touch pwned-2`; touch pwned-3 && echo $HOME\n"
    "second line \\\n\ttabbed ${IFS} 'unbalanced \" quote"
)
URLS = {
    "openai": "http://127.0.0.1:9/s/x/v1",
    "anthropic": "http://127.0.0.1:9/s/x",
    "google": "http://127.0.0.1:9/s/x",
}


async def run_shell(
    tmp_path: Path, command: Any, instruction: str = NASTY, timeout: float = 60
) -> tuple[HarnessRun, Path]:
    handle = await get_runtime("local").start(RuntimeSpec(), RuntimeContext("t1", scratch_root=tmp_path / "scratch"))
    try:
        ctx = context_for(handle, instruction=instruction, model="m", api_key="k", base_urls=URLS,
                          config={"command": command})  # fmt: skip
        run = await run_harness(get_harness("shell"), handle, ctx, timeout=timeout)
        copy = tmp_path / "session"
        await handle.download(handle.session_path, copy)
        return run, copy
    finally:
        await handle.stop()


def test_shell_instruction_reaches_the_command_verbatim_and_runs_nothing(tmp_path: Path) -> None:
    command = 'printf "%s" "$POLAR_INSTRUCTION" > via-env.txt; cat "$POLAR_INSTRUCTION_FILE" > via-file.txt'
    run, session = asyncio.run(run_shell(tmp_path, command))
    assert run.ok, failure_report(get_harness("shell"), run)
    assert (session / "via-env.txt").read_text() == NASTY
    assert (session / "via-file.txt").read_text() == NASTY
    assert not list(session.rglob("pwned*"))


def test_shell_argv_command_gets_the_instruction_only_through_env_and_file(tmp_path: Path) -> None:
    argv = ["bash", "-c", 'printf "%s" "$POLAR_INSTRUCTION" > got.txt', "ignored-$0"]
    run, session = asyncio.run(run_shell(tmp_path, argv))
    assert run.ok and (session / "got.txt").read_text() == NASTY


def test_failure_is_reported_with_the_harness_own_stderr(tmp_path: Path) -> None:
    run, _ = asyncio.run(run_shell(tmp_path, 'echo "agent crashed: no model" >&2; exit 3'))
    assert not run.ok and run.failure == "shell exited with status 3"
    report = failure_report(get_harness("shell"), run)
    assert "shell exited with status 3" in report and "agent crashed: no model" in report


def test_timeout_is_a_failure(tmp_path: Path) -> None:
    run, _ = asyncio.run(run_shell(tmp_path, "echo started >&2; sleep 30", timeout=1))
    assert run.timed_out and run.failure and "timed out" in run.failure
    assert "started" in failure_report(get_harness("shell"), run)


@pytest.mark.harness
def test_pi_reports_a_backend_error_as_a_failure_with_its_stderr(tmp_path: Path) -> None:
    """A failing model call ends pi's turn with an error; pi may exit 0, the adapter must not call that a success."""
    pi = get_harness("pi")
    reason = missing_cli_reason(pi)
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)

    async def scenario() -> HarnessRun:
        with tempfile.TemporaryDirectory() as journal:
            async with doctor_proxy(Path(journal)) as proxy:
                script = [{"error": {"status": 400, "message": "scripted refusal for the test"}}]
                session = await proxy.create_session(script)
                context = RuntimeContext(session["session_id"], tools_dir=pi.tools_dir(), scratch_root=tmp_path)
                async with await get_runtime("local").start(RuntimeSpec(), context) as handle:
                    ctx = context_for(handle, instruction="hi", model="m", api_key=session["api_key"],
                                      base_urls=session["base_urls"])  # fmt: skip
                    return await run_harness(pi, handle, ctx, timeout=120)

    run = asyncio.run(scenario())
    assert not run.ok, run
    assert "scripted refusal for the test" in (run.failure or "") + run.stderr, json.dumps(run.__dict__)[:2000]


async def harness_cwd(spec: RuntimeSpec, scratch: Path) -> tuple[str, str]:
    """Where the shell harness and a plain exec start in a runtime made from ``spec``."""
    context = RuntimeContext("t-cwd", scratch_root=scratch)
    async with await get_runtime(spec.backend).start(spec, context) as handle:
        ctx = context_for(handle, instruction="hi", model="m", api_key="k", base_urls=URLS,
                          config={"command": "pwd > $HOME/cwd.txt"})  # fmt: skip
        run = await run_harness(get_harness("shell"), handle, ctx, timeout=60)
        assert run.ok, failure_report(get_harness("shell"), run)
        seen = (await handle.exec(["cat", f"{handle.home_path}/cwd.txt"])).stdout.strip()
        return ctx.workdir, seen


def test_the_harness_starts_in_the_task_workdir_or_the_session_dir(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    workdir, seen = asyncio.run(harness_cwd(RuntimeSpec(workdir=str(repo)), tmp_path / "s1"))
    assert workdir == seen == str(repo)
    workdir, seen = asyncio.run(harness_cwd(RuntimeSpec(), tmp_path / "s2"))
    assert workdir == seen and seen.endswith("session")


@pytest.mark.docker
def test_the_harness_starts_in_the_task_workdir_in_docker(tmp_path: Path, docker_image: str) -> None:
    spec = RuntimeSpec(backend="docker", image=docker_image, workdir="/testbed")
    assert asyncio.run(harness_cwd(spec, tmp_path / "s")) == ("/testbed", "/testbed")
    spec = RuntimeSpec(backend="docker", image=docker_image)
    assert asyncio.run(harness_cwd(spec, tmp_path / "s")) == ("/polar/session", "/polar/session")
