"""The scheduler's round: healthy, non-draining nodes by headroom (the server's own count), water-filled, another node
on retry."""

from __future__ import annotations

from polar_cli.server.config import ServerConfig
from polar_cli.server.scheduler import NodeView as NodeLoad
from polar_cli.server.scheduler import spread


def picks(nodes: list[NodeLoad], sessions: int, avoid: str | None = None, **options: object) -> list[str]:
    return [n.node_id for n in spread(nodes, [avoid] * sessions, **options)]  # type: ignore[arg-type]


def test_most_headroom_wins_and_unhealthy_or_draining_nodes_get_nothing() -> None:
    busy = NodeLoad("a", run_slots=4, assigned=6)
    idle = NodeLoad("b", run_slots=2)
    assert picks([busy, idle], 1) == ["b"]
    assert picks([NodeLoad("a", run_slots=4, assigned=6), NodeLoad("b", run_slots=2, healthy=False)], 1) == ["a"]
    assert picks([NodeLoad("a", run_slots=4, draining=True), NodeLoad("b", run_slots=1, healthy=False)], 1) == []
    # equal headroom: the lower id
    assert picks([NodeLoad("b", run_slots=4, assigned=1), NodeLoad("a", run_slots=4, assigned=1)], 1) == ["a"]


def test_headroom_is_the_servers_count_not_the_heartbeats_snapshot() -> None:
    """A heartbeat that still counts sessions whose results have arrived since takes no headroom away: the results
    lowered ``assigned``, and that alone is the load."""
    stale = NodeLoad("a", run_slots=2, assigned=1, running=2, queued=2)
    assert picks([stale], 5) == ["a", "a", "a"]  # 2 slots + 2 queued - 1 assigned
    assert picks([NodeLoad("a", run_slots=2, assigned=4)], 1) == []  # full
    assert picks([NodeLoad("a", run_slots=2, assigned=2)], 1, max_queued=0) == []


def test_a_burst_fills_every_node_in_one_round_spread_over_them() -> None:
    nodes = [NodeLoad("a", run_slots=8), NodeLoad("b", run_slots=8), NodeLoad("c", run_slots=4, assigned=2)]
    chosen = picks(nodes, 100, max_queued=0)
    assert chosen[:6] == ["a", "b", "a", "b", "a", "b"]  # the idle nodes first, in turn, until c has as much room
    assert chosen.count("a") == 8 and chosen.count("b") == 8 and chosen.count("c") == 2  # every free slot, no more
    assert [n.assigned for n in nodes] == [8, 8, 4]
    assert picks(nodes, 1, max_queued=0) == []


def test_a_retry_avoids_the_node_of_the_lost_attempt_when_it_can() -> None:
    nodes = [NodeLoad("a", run_slots=8), NodeLoad("b", run_slots=2, assigned=1)]
    assert picks(nodes, 1, avoid="a") == ["b"]
    assert picks([NodeLoad("a", run_slots=8)], 1, avoid="a") == ["a"]
    mixed = [NodeLoad("a", run_slots=1), NodeLoad("b", run_slots=1)]
    assert [n.node_id for n in spread(mixed, ["a", "b", None, None, None], max_queued=0)] == ["b", "a"]


def test_a_config_that_still_names_reservations_per_node_loads_with_a_note() -> None:
    assert ServerConfig().notes() == []
    old = ServerConfig.model_validate({"reservations_per_node": 8})
    [note] = old.notes()
    assert "reservations_per_node is deprecated and ignored" in note and "max_queued_per_node" in note
