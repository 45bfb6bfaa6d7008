"""Warm pools and reuse on real Docker, through one real gateway: a SWE-like image (a git repository with a buggy
script and its test, built once for the module), the shell harness running the reference agent, the scripted backend
playing a model whose one tool call reports the sandbox's state at session start and then dirties it."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.harnesses.testing import require_cli
from polar_cli.models import SessionResult, TaskRequest
from polar_cli.registry import LOAD_ENV, reset_registry
from tests.gateway.sim import until
from tests.runtimes.conftest import TEST_IMAGE
from tests.support.swe_image import FIX as SWE_FIX
from tests.support.swe_image import build_image, remove_image, swe_task

T = TypeVar("T")
# At session start: what the session sees (HEAD, untracked/ignored files, what earlier sessions planted, their
# processes, its own id); then it dirties the sandbox everywhere a harness could.
REPORT = (
    'echo "HEAD=$(git rev-parse HEAD) STATUS=$(git status --porcelain --ignored | wc -l)'
    " PLANTED=$(ls -d /opt/planted /root/planted /tmp/planted $HOME/planted /polar/session/planted 2>/dev/null | wc -l)"
    ' PROCS=$(ps -eo args | grep -c "^[s]leep 300") BRANCHES=$(git branch | wc -l) SID=$POLAR_SESSION_ID'
    " POOL_ID=$(tr '\\0' '\\n' </proc/1/environ | sed -n 's/^POLAR_SESSION_ID=//p')\"; "
    "mkdir -p /opt/planted && echo x > /opt/planted/f;"
    " for d in /root /tmp $HOME /polar/session; do echo x > $d/planted; done;"
    " echo junk > untracked.txt; mkdir -p build && echo junk > build/out;"
    " (sleep 300 >/dev/null 2>&1 &); git checkout -qb wip-$$"
)
FIX = f"; {SWE_FIX}"
COMMIT = "; git commit -qam wip"


def run_in(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float = 500) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


@pytest.fixture(scope="module")
def image(docker_engine: Any) -> Iterator[str]:
    tag = build_image(TEST_IMAGE, "polar-pool-swe")
    yield tag
    remove_image(tag)


class Gateway:
    """One gateway node on an event loop of its own thread, shared by the module's tests."""

    def __init__(self, node: GatewayNode, loop: asyncio.AbstractEventLoop) -> None:
        self.node, self.loop = node, loop

    def run(self, tasks: list[TaskRequest], samples: int) -> list[SessionResult]:
        async def body() -> list[SessionResult]:
            jobs = [await self.node.submit(t, i) for i in range(samples) for t in tasks]
            return [await self.node.pipeline.wait(job.session_id) for job in jobs]

        return run_in(self.loop, body())

    def stats(self) -> dict[str, Any]:
        """The pool's counters once no reset is under way (resets run after the session's result)."""
        pool = self.node.sandboxes
        run_in(self.loop, until(lambda: pool.snapshot()["coming"] == 0, "the resets under way", within=120))
        return run_in(self.loop, _snapshot(self.node))


async def _snapshot(node: GatewayNode) -> dict[str, Any]:
    return node.sandboxes.snapshot()


@pytest.fixture(scope="module")
def gateway(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("pool-gateway")
    config = GatewayConfig(port=0, data_dir=root / "data", scratch_root=root / "scratch", pipeline={
        "init_workers": 4, "run_slots": 4, "postrun_workers": 4,
        "sandbox_pool": {"max": 4, "min": 0, "parallel": 4, "idle_seconds": 120},
    })  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOAD_ENV, "")  # no stray installed plugin (the suite's autouse fixture is function-scoped)
        reset_registry()
        require_cli("shell")  # the reference agent runs on the shell harness's Node
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        node = GatewayNode(config)
        try:
            run_in(loop, node.start())
            yield Gateway(node, loop)
        finally:
            run_in(loop, node.close())
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            loop.close()
    assert not list((root / "scratch").glob("docker-*")), "a sandbox's scratch dir outlived the gateway"


def tasks(image: str, reuse: str = "reset") -> list[TaskRequest]:
    suffix = "" if reuse == "reset" else "-fresh"
    return [
        swe_task(image, f"fix{suffix}", REPORT + FIX, reuse=reuse),
        swe_task(image, f"fix-commit{suffix}", REPORT + FIX + COMMIT, reuse=reuse, refresh=True),
        swe_task(image, f"nofix-commit{suffix}", REPORT + COMMIT, reuse=reuse),
        swe_task(image, f"nofix{suffix}", REPORT, reuse=reuse, refresh=True),
    ]


def report(result: SessionResult) -> dict[str, str]:
    """The state the session's tool call saw at its start (the tool result in the second call's prompt)."""
    traces = result.trajectory.traces
    assert len(traces) == 2, result.error
    tool = [m for m in traces[1].prompt_messages if m.get("role") == "tool"]
    line = next(ln for ln in str(tool[-1]["content"]).splitlines() if ln.startswith("HEAD="))
    return dict(part.split("=", 1) for part in line.split())


def base_commit(image: str) -> str:
    done = subprocess.run(["docker", "run", "--rm", "-w", "/repo", image, "git", "rev-parse", "HEAD"],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip()


def test_32_sessions_reuse_sandboxes_that_start_clean(gateway: Gateway, image: str) -> None:
    before = gateway.stats()
    results = gateway.run(tasks(image), samples=8)
    assert [r.status for r in results] == ["completed"] * 32, [r.error for r in results if r.error]
    base = base_commit(image)
    sandboxes: Counter[str] = Counter()
    for result in results:
        seen = report(result)
        # every session starts at the base commit, with no untracked or ignored file, nothing an earlier session
        # planted outside the repository, none of its processes, no branch it made, and its own id
        assert (seen["HEAD"], seen["STATUS"], seen["PLANTED"], seen["PROCS"], seen["BRANCHES"]) == (
            base, "0", "0", "0", "1"), (result.session_id, seen)  # fmt: skip
        assert seen["SID"] == result.session_id
        assert seen["POOL_ID"].startswith("pool-")  # the sandbox's own id: never another session's
        sandboxes[seen["POOL_ID"]] += 1
    stats = gateway.stats()
    resets = stats["resets_ok"] - before["resets_ok"]
    assert stats["resets_failed"] == before["resets_failed"]
    assert resets >= 16, stats  # most sessions ran in a reused sandbox
    assert max(sandboxes.values()) <= 4  # reuse_max_sessions: no sandbox served more than 4 sessions
    assert len(sandboxes) < 32
    rewards = {r.task_id: r.reward for r in results}
    assert rewards == {"fix": 1.0, "fix-commit": 1.0, "nofix-commit": 0.0, "nofix": 0.0}
    assert all(r.reward == rewards[r.task_id] for r in results)

    # without reuse (fresh sandboxes, destroyed after each session) every task scores the same
    fresh = gateway.run(tasks(image, reuse="none"), samples=1)
    assert {r.task_id.removesuffix("-fresh"): r.reward for r in fresh} == rewards
    assert gateway.stats()["resets_ok"] == stats["resets_ok"]  # none of those was reset


def test_a_failed_reset_destroys_the_sandbox(gateway: Gateway, image: str, docker_engine: Any) -> None:
    before = gateway.stats()
    # a file that existed at the checkpoint is changed: the reset cannot undo that, so the sandbox must go. Its own
    # pool key (max_sessions): a sandbox the first test left with 3 of its 4 sessions would be destroyed unreset
    tamper = swe_task(image, "tamper", REPORT + "; echo tampered >> /etc/polar-prepared", max_sessions=8)
    (result,) = gateway.run([tamper], 1)
    assert result.status == "completed", result.error
    pool_id = report(result)["POOL_ID"]

    node = gateway.node

    # the reset runs after the result, within its budget (ResetSpec.timeout_seconds, 120 s): wait out that budget
    def failed() -> bool:
        return node.sandboxes.stats.resets_failed > before["resets_failed"]

    run_in(gateway.loop, until(failed, "the reset", within=150))
    assert pool_id.startswith("pool-")
    mine = {"label": f"polar.session={pool_id}"}
    assert not docker_engine.containers.list(all=True, filters=mine, ignore_removed=True)
