"""The sandbox pool on the local runtime (no Docker): sizing (floor, ceiling, idle shrink), lending under the
session's id, reuse limits, evaluation sandboxes never used before, a failing reset destroying its sandbox, and a
reset that leaves a git repository and the session's dirs as prepare left them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import ConfigError
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import TaskRequest
from polar_cli.models.task import RuntimeSpec
from polar_cli.runtimes.local import LocalHandle
from polar_cli.runtimes.pool import SandboxPool, SandboxPoolConfig, SandboxRecipe, SessionSandbox
from polar_cli.task_check import check_task
from tests.gateway.sim import until
from tests.gateway.test_node import config, task
from tests.runtimes.conftest import run

REPO = (
    "git init -q -b main repo && cd repo && echo one > f && git add f"
    " && git -c user.name=p -c user.email=p@example.invalid commit -qm base && echo prepared > ../prepared"
)
# what a session does: dirty the repository (an edit, a commit on a new branch, untracked and ignored files), plant
# files in the session dir and home, change what prepare wrote, leave a process behind
DIRTY = (
    "cd repo && echo two > f && git checkout -qb wip && git -c user.name=p -c user.email=p@example.invalid commit"
    " -qam wip && echo x > untracked && echo x > ../planted && echo x > $HOME/planted"
    " && (sleep 300 >/dev/null 2>&1 &)"
)


def recipe(scratch: Path, **spec: Any) -> SandboxRecipe:
    return SandboxRecipe(RuntimeSpec.model_validate({"backend": "local", **spec}), scratch_root=scratch)


def reset_recipe(scratch: Path, **spec: Any) -> SandboxRecipe:
    reset = {"git": "repo", "check": 'test "$(cat f)" = one'}
    return recipe(scratch, prepare=[{"command": REPO}], reuse="reset", reset=reset, **spec)


async def settled(pool: SandboxPool) -> dict[str, Any]:
    await until(lambda: pool.snapshot()["coming"] == 0, "the pool's starts and resets", within=60)
    return pool.snapshot()


def test_pool_sizes_from_demand_within_floor_and_ceiling_and_shrinks_when_idle(scratch_root: Path) -> None:
    one = recipe(scratch_root)
    waiting: list[SandboxRecipe] = []
    config = SandboxPoolConfig(min=1, max=3, parallel=2, idle_seconds=0.5)

    async def body() -> None:
        pool = SandboxPool(config, demand=lambda: waiting)  # resized by hand: no background loop
        try:
            waiting[:] = [one] * 2
            pool.resize()
            assert (await settled(pool))["ready"] == 2  # two sessions wait: two sandboxes
            waiting[:] = [one] * 10
            pool.resize()
            assert (await settled(pool))["ready"] == 3  # the ceiling
            waiting[:] = []
            pool.resize()
            assert pool.ready(one) == 3  # not idle for long yet
            await asyncio.sleep(0.6)
            pool.resize()
            await until(lambda: pool.stats.destroyed == 3, "the shrink")
            assert pool.ready(one) == 0  # idle too long, and no session wanted this spec for as long: none left
            assert pool.stats.started == 3
        finally:
            await pool.close()

    run(body())
    assert not list(scratch_root.glob("local-*"))


def test_floor_kept_while_in_use_and_sessions_take_ready_sandboxes(scratch_root: Path) -> None:
    one = recipe(scratch_root)

    async def body() -> None:
        async with SandboxPool(SandboxPoolConfig(min=2, max=2, idle_seconds=30)) as pool:
            first = await pool.acquire(one, "sess-a")  # a miss: nothing was known of this spec
            await until(lambda: pool.ready(one) == 2, "the floor", within=30)
            second = await pool.acquire(one, "sess-b")
            assert (pool.stats.hits, pool.stats.misses) == (1, 1)
            assert isinstance(second, SessionSandbox) and second.session_id == "sess-b"
            result = await second.exec(["/bin/sh", "-c", 'echo "$POLAR_SESSION_ID"; basename "$(dirname "$PWD")"'])
            seen_id, scratch_name = result.stdout.split()
            assert seen_id == "sess-b"  # the session's own id, though the sandbox started before it was known
            assert scratch_name.startswith("local-pool-") and "sess" not in scratch_name
            await pool.release(first, reuse=True)  # no reuse: reset in the spec: destroyed
            await second.stop()  # stop() never puts back
            assert pool.stats.destroyed == 2 and pool.stats.resets_ok == 0
            await until(lambda: pool.ready(one) == 2, "the refill", within=30)

    run(body())
    assert not list(scratch_root.glob("local-*"))  # close() stopped the ready ones


def test_reset_restores_repo_and_dirs_and_reuse_stops_at_its_limit(scratch_root: Path) -> None:
    spec = reset_recipe(scratch_root, reuse_max_sessions=3)

    async def body() -> None:
        async with SandboxPool(SandboxPoolConfig(max=2, idle_seconds=30)) as pool:
            sandboxes = []
            for n in range(4):
                handle = await pool.acquire(spec, f"sess-{n}")
                assert isinstance(handle, SessionSandbox)
                sandboxes.append(handle.sandbox)
                inner = handle.sandbox.handle
                assert isinstance(inner, LocalHandle)
                state = await handle.exec(["/bin/sh", "-c", "cd repo && git status --porcelain --ignored && "
                                           "git branch && cat f && ls .. && ls -A $HOME"])  # fmt: skip
                assert state.stdout.split() == ["*", "main", "one", "prepared", "repo"], state
                assert (await handle.exec(["/bin/sh", "-c", DIRTY])).ok
                await pool.release(handle, reuse=True)
                await settled(pool)
            assert sandboxes[0] is sandboxes[1] is sandboxes[2]  # reused twice, then at its limit of 3 sessions
            assert sandboxes[3] is not sandboxes[0]
            assert (pool.stats.resets_ok, pool.stats.resets_failed, pool.stats.destroyed) == (3, 0, 1)

    run(body())
    assert not list(scratch_root.glob("local-*"))


def test_a_failing_reset_destroys_the_sandbox(scratch_root: Path) -> None:
    spec = reset_recipe(scratch_root)

    async def body() -> None:
        async with SandboxPool(SandboxPoolConfig(max=2, idle_seconds=30)) as pool:
            for damage in ("echo changed > prepared", "echo x > $HOME/planted && chmod 000 $HOME"):
                handle = await pool.acquire(spec, "sess")
                assert isinstance(handle, SessionSandbox)
                root = handle.sandbox.handle.session_dir.parent
                assert (await handle.exec(["/bin/sh", "-c", damage])).ok
                failed = pool.stats.resets_failed
                await pool.release(handle, reuse=True)
                await until(lambda: pool.stats.resets_failed == failed + 1, "the failed reset")  # noqa: B023
                assert not root.exists() and pool.ready(spec) == 0

    run(body())


def test_evaluation_sandboxes_are_never_used_ones(scratch_root: Path) -> None:
    spec = reset_recipe(scratch_root)

    async def body() -> None:
        async with SandboxPool(SandboxPoolConfig(max=2, idle_seconds=30)) as pool:
            agent = await pool.acquire(spec, "sess")
            assert isinstance(agent, SessionSandbox)
            await pool.release(agent, reuse=True)
            assert (await settled(pool))["ready"] == 1  # the used sandbox, reset
            evaluation = await pool.acquire(spec, "sess-eval", evaluation=True)
            assert isinstance(evaluation, SessionSandbox) and evaluation.sandbox is not agent.sandbox
            assert pool.stats.misses == 2 and pool.ready(spec) == 1
            await pool.release(evaluation, reuse=True)  # never put back: evaluation sandboxes serve one session
            assert pool.stats.destroyed == 1

    run(body())


def test_no_pool_by_default_and_reuse_needs_a_runtime_that_restores(scratch_root: Path) -> None:
    async def body() -> None:
        async with SandboxPool() as pool:
            handle = await pool.acquire(reset_recipe(scratch_root), "sess-plain")
            assert not isinstance(handle, SessionSandbox) and handle.session_id == "sess-plain"
            assert "sess-plain" in handle.session_dir.parent.name
            await pool.release(handle, reuse=True)
            assert pool.snapshot()["ready"] == 0

    run(body())
    assert not list(scratch_root.glob("local-*"))
    task = {"instruction": "x", "agent": {"harness": "shell", "config": {"command": "true"}},
            "runtime": {"backend": "apptainer", "image": "x.sif", "reuse": "reset"}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"runtime\.reuse: runtime 'apptainer' cannot reset a sandbox"):
        check_task(TaskRequest.model_validate(task))
    with pytest.raises(ValueError, match="min"):
        SandboxPoolConfig(min=3, max=2)


def test_through_a_gateway_a_completed_session_returns_its_sandbox_and_a_failed_one_destroys_it(tmp_path: Path) -> None:
    runtime = {"backend": "local", "reuse": "reset"}
    ok, crash = task("ok", {}, runtime=runtime), task("crash", {"CALLS": "1", "CRASH": "boom"}, runtime=runtime)

    async def body() -> None:
        async with GatewayNode(config(tmp_path, sandbox_pool={"max": 2, "idle_seconds": 60})) as node:
            pool = node.sandboxes
            first = await node.pipeline.run(node.job_for(ok, 0))
            assert first.status == "completed", first.error
            await settled(pool)
            assert (pool.stats.resets_ok, pool.stats.destroyed, pool.ready(node.driver.recipe(ok))) == (1, 0, 1)
            failed = await node.pipeline.run(node.job_for(crash, 0))
            assert failed.status == "error"
            await settled(pool)
            assert (pool.stats.hits, pool.stats.resets_ok, pool.stats.destroyed) == (1, 1, 1)  # not reset: destroyed

    run(body())
    assert not list((tmp_path / "scratch").glob("local-*"))  # the gateway's close stopped the ready one


def test_pooled_sandboxes_carry_the_node_id_and_the_ttl_sweep_leaves_them_alone(tmp_path: Path) -> None:
    """A ready sandbox belongs to no session: the gateway's TTL sweep must still count it as held."""
    ok = task("ok", {}, runtime={"backend": "local", "reuse": "reset"})
    cfg = config(tmp_path, sandbox_pool={"max": 2, "idle_seconds": 60})
    cfg.runtime_gc.ttl_seconds = 0.01
    cfg.runtime_gc.interval_seconds = None

    async def body() -> None:
        async with GatewayNode(cfg) as node:
            pool = node.sandboxes
            done = await node.pipeline.run(node.job_for(ok, 0))
            assert done.status == "completed", done.error
            await settled(pool)
            assert pool.ready(node.driver.recipe(ok)) == 1
            [held] = pool.held()
            [scratch] = (tmp_path / "scratch").glob(f"local-{held}-*")
            assert json.loads((scratch / ".owner.json").read_text())["node_id"] == node.node_id
            await asyncio.sleep(0.05)  # older than the TTL
            report = await node.sweeps.ttl_sweep()
            assert not report.removed and scratch.exists()
            assert pool.ready(node.driver.recipe(ok)) == 1

    run(body())
