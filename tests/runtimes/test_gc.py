"""The sweeps' rules (``polar_cli.runtimes.gc``) and the gateway's TTL sweep over real local-runtime sessions."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from pathlib import Path

from polar_cli.gateway.config import GatewayConfig, RuntimeGcConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.gateway.sweeps import RuntimeSweeps, local_node_id
from polar_cli.interfaces.runtime import Leftover, Owner, RuntimeContext
from polar_cli.models.task import RuntimeSpec
from polar_cli.registry import get_runtime
from polar_cli.runtimes.base import ScratchHandle
from polar_cli.runtimes.gc import GcRule, live_nodes
from polar_cli.runtimes.scratch import OWNER_FILE, this_process
from tests.runtimes.conftest import gone, run, wait_for_file

HOUR = 3600.0


def dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def item(node: str | None, owner: Owner, created: float = 0.0, session: str = "s") -> Leftover:
    return Leftover(runtime="local", kind="scratch", name=f"{node}-{session}", session_id=session, node_id=node,
                    owner=owner, created=created)  # fmt: skip


def test_the_rule_never_picks_a_live_makers_thing_nor_another_hosts_nor_a_live_nodes() -> None:
    me, host = this_process(), socket.gethostname()
    dead = Owner(host, dead_pid())
    recycled = Owner(host, me.pid, (me.started or 0) + 1)  # this pid, but a process that started at another time
    items = [item("a", dead), item("a", me), item("b", dead), item("c", Owner("another-host", 1)), item("d", recycled)]
    live = live_nodes(items)
    assert live == {"a", "c"}  # a: this process; c: another host's is taken for alive

    def picked(rule: GcRule, now: float = 10.0) -> list[str]:
        return [i.name for i in items if rule.reason(i, now, live) is not None]

    assert picked(GcRule()) == ["a-s", "b-s", "d-s"]  # maker gone (a recycled pid included)
    assert picked(GcRule(spare_live_nodes=True)) == ["b-s", "d-s"]  # polar runtimes gc: node a has a live gateway
    assert picked(GcRule(node_id="b")) == ["b-s"]
    assert picked(GcRule(older_than_s=11.0)) == []  # all made at 0: 10 s old
    assert picked(GcRule(node_id="a", held=frozenset({"s"}))) == ["a-s"]  # only the dead maker's: this one's is held
    assert picked(GcRule(node_id="a", held=frozenset())) == ["a-s", "a-s"]  # this process's, held by no session


def age(handle: ScratchHandle, seconds: float) -> None:
    """Make the session's scratch dir look ``seconds`` old (its owner file says when it was made)."""
    owner_file = handle.scratch.root / OWNER_FILE
    owner = json.loads(owner_file.read_text())
    owner_file.write_text(json.dumps({**owner, "created": time.time() - seconds}))


def test_the_ttl_sweep_removes_only_this_nodes_old_things_no_live_session_holds(scratch_root: Path) -> None:
    async def start(session: str, node: str) -> ScratchHandle:
        context = RuntimeContext(session, scratch_root=scratch_root, node_id=node)
        handle = await get_runtime("local").start(RuntimeSpec(backend="local"), context)
        assert isinstance(handle, ScratchHandle)
        return handle

    async def body() -> None:
        held, leaked, young = await start("held", "n1"), await start("leaked", "n1"), await start("young", "n1")
        other = await start("other", "n2")
        for handle in (held, leaked, other):
            age(handle, 2 * HOUR)
        running = asyncio.create_task(leaked.exec(["sh", "-c", "echo $$ > me.pid; exec sleep 300"]))
        pid = int(await wait_for_file(leaked.session_dir / "me.pid"))
        config = RuntimeGcConfig(ttl_seconds=HOUR, interval_seconds=None)
        sweeps = RuntimeSweeps(config, node_id=lambda: "n1", held=lambda: ["held"], scratch_root=scratch_root)
        report = await sweeps.ttl_sweep()
        assert [r.leftover.session_id for r in report.removed] == ["leaked"]
        assert report.removed[0].reason == "no session of this gateway holds it"
        assert gone(pid) and not leaked.scratch.root.exists()  # its process group went with it
        await running
        assert all(h.scratch.root.exists() for h in (held, young, other))
        # the periodic form: a sweep every interval finds what leaks later
        age(young, 2 * HOUR)
        periodic = RuntimeSweeps(config.model_copy(update={"interval_seconds": 0.05}), node_id=lambda: "n1",
                                 held=lambda: ["held"], scratch_root=scratch_root)  # fmt: skip
        periodic.start()
        try:
            while young.scratch.root.exists():
                await asyncio.sleep(0.05)
        finally:
            await periodic.close()
        assert held.scratch.root.exists() and other.scratch.root.exists()
        for handle in (held, leaked, young, other):
            await handle.stop()

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_a_gateway_no_server_names_sweeps_what_its_killed_run_left_on_the_same_data_dir(tmp_path: Path) -> None:
    """``polar run``'s node id comes from its data dir: its next start there removes what a killed run left."""
    config = GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch", backend_check="off")
    node = local_node_id(tmp_path / "data")
    assert GatewayNode(config).node_id == node == local_node_id(tmp_path / "x" / ".." / "data")

    async def body() -> None:
        context = RuntimeContext("killed", scratch_root=config.scratch_root, node_id=node)
        left = await get_runtime("local").start(RuntimeSpec(backend="local"), context)
        assert isinstance(left, ScratchHandle)
        other = await get_runtime("local").start(RuntimeSpec(backend="local"), RuntimeContext(
            "other", scratch_root=config.scratch_root, node_id="another-node"))  # fmt: skip
        assert isinstance(other, ScratchHandle)
        for handle in (left, other):  # as if made by a run killed since
            owner_file = handle.scratch.root / OWNER_FILE
            owner_file.write_text(json.dumps({**json.loads(owner_file.read_text()), "pid": dead_pid()}))
        async with GatewayNode(config) as gateway:
            assert gateway.url is not None
            assert not left.scratch.root.exists() and other.scratch.root.exists()
        await other.stop()

    run(body())
