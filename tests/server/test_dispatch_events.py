"""Dispatch driven by events, end to end: a real ``polar serve`` server and gateways on loopback, the shell harness.

Heartbeats here are 5 s apart, so dispatch paced by heartbeats (a few sessions per node per heartbeat) would leave
slots idle for seconds; dispatch driven by results refills a slot as soon as its session's result is in. Each session
records when its own command started and ended, and the assertions are about slot occupancy, never wall-clock limits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.server.procs import Serve, client, gateway, serve_config, until_true, waiting_task
from tests.server.test_service import finished

SLOTS = 16
SESSIONS = 64
SECONDS = 0.2
HANDOVER_S = 2.5
"""The most a freed slot may wait for its next session (the gateway starting the next harness process on a busy
machine); a heartbeat-paced dispatch would wait up to a heartbeat, 5 s, so over 48 handovers some would pass this."""
SLOW_HEARTBEATS = {"heartbeat_interval_s": 5.0}


def timed_task(task_id: str, samples: int, log: Path) -> dict[str, Any]:
    """A task whose agent sleeps ``SECONDS`` and appends its own start and end times to ``log`` (one line each)."""
    data = waiting_task(task_id, samples)
    data["agent"]["config"] = {
        "command": f's=$(date +%s.%N); sleep {SECONDS}; echo "$s $(date +%s.%N)" >> "{log}"',
    }
    data["metadata"] = {"group_id": task_id}
    return data


def spans(log: Path) -> list[tuple[float, float]]:
    return [(float(start), float(end)) for start, end in (line.split() for line in log.read_text().splitlines())]


def peak(runs: list[tuple[float, float]]) -> int:
    """The most sessions running at one moment."""
    events = sorted([(start, 1) for start, _ in runs] + [(end, -1) for _, end in runs])  # an end before a start
    running = best = 0
    for _, step in events:
        running += step
        best = max(best, running)
    return best


def test_a_burst_fills_every_run_slot_at_once_and_each_freed_slot_at_once(tmp_path: Path) -> None:
    """64 sessions of 0.2 s on 16 run slots: the first 16 all start within one handover of the first (one dispatch
    round filled the node), and the (16 + j)-th session starts within one handover of the j-th ending (a result
    frees its slot for a pending session at once). Together: the run takes about 64 / 16 * 0.2 s plus 4 handovers."""
    pipeline = {"init_workers": SLOTS, "ready_capacity": SLOTS, "run_slots": SLOTS, "postrun_workers": SLOTS}
    config = serve_config(tmp_path, "serve", server=SLOW_HEARTBEATS, gateway={"pipeline": pipeline})
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    gateways: list[Serve] = []
    log = tmp_path / "runs.log"

    async def body() -> None:
        info = await server.ready()
        gateways.append(gateway(tmp_path, "gw", info, config, "token-gw"))
        await gateways[0].ready()
        async with client(info) as http:
            submitted = await http.post("/rollout/task/submit", json=timed_task("burst", SESSIONS, log))
            assert submitted.status_code == 200, submitted.text
        status = await finished(info, "burst")
        assert len(status.results) == SESSIONS
        # the agent makes no model call: each session ends so, its command having run to the end
        assert {(r.status, r.metadata["run_status"]) for r in status.results} == {("no_model_call", "completed")}

    try:
        asyncio.run(body())
    finally:
        for process in [*gateways, server]:
            process.stop()
    runs = spans(log)
    assert len(runs) == SESSIONS
    starts = sorted(start for start, _ in runs)
    ends = sorted(end for _, end in runs)
    assert peak(runs) == SLOTS
    late = [(i, round(starts[i] - starts[0], 3)) for i in range(SLOTS) if starts[i] > starts[0] + HANDOVER_S]
    assert not late, f"sessions of the first wave that waited for a later dispatch: {late}"
    waits = [(j, round(starts[SLOTS + j] - ends[j], 3)) for j in range(SESSIONS - SLOTS)]
    assert all(wait <= HANDOVER_S for _, wait in waits), f"freed slots left idle while sessions were pending: {waits}"


def test_a_burst_over_two_gateways_spreads_over_both(tmp_path: Path) -> None:
    """Two gateways of 4 run slots, nothing queued beyond them: a burst of 12 sessions gives each node 4 in the one
    round, and the 4 left wait for slots; once the sessions run on, every one finishes. The config file still names
    the old ``reservations_per_node``: it loads, with a note that it is ignored."""
    pipeline = {"init_workers": 4, "run_slots": 4, "postrun_workers": 4}
    old = {**SLOW_HEARTBEATS, "max_queued_per_node": 0, "reservations_per_node": 1}
    config = serve_config(tmp_path, "serve", server=old, gateway={"pipeline": pipeline})
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    gateways: list[Serve] = []
    marker = tmp_path / "go"

    async def body() -> None:
        info = await server.ready()
        gateways.extend([gateway(tmp_path, "gw-a", info, config, "token-a"),
                         gateway(tmp_path, "gw-b", info, config, "token-b")])  # fmt: skip
        nodes = [await g.ready() for g in gateways]
        async with client(info) as http:
            submitted = await http.post("/rollout/task/submit", json=waiting_task("spread", 12, marker))
            assert submitted.status_code == 200, submitted.text

            async def spread_out() -> dict[str, Any] | None:
                overview: dict[str, Any] = (await http.get("/rollout/status")).json()
                return overview if overview["pending_sessions"] == 4 else None

            overview = await until_true(spread_out, "the burst to be dispatched")
        assigned = {n["node_id"]: n["load"]["assigned"] for n in overview["nodes"]}
        assert assigned == {n["node_id"]: 4 for n in nodes}
        marker.touch()
        status = await finished(info, "spread")
        assert {r.status for r in status.results} == {"completed"} and len(status.results) == 12
        assert {r.metadata["node_id"] for r in status.results} == {n["node_id"] for n in nodes}
        assert "Note: server.reservations_per_node is deprecated and ignored" in server.stderr()

    try:
        asyncio.run(body())
    finally:
        for process in [*gateways, server]:
            process.stop()
