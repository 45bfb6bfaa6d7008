"""The scheduler's choice: healthy, non-draining nodes by headroom, bounded reservations, another node on retry."""

from __future__ import annotations

from polar_cli.server.scheduler import NodeView as NodeLoad
from polar_cli.server.scheduler import choose_node


def pick(nodes: list[NodeLoad], **options: object) -> str | None:
    chosen = choose_node(nodes, **options)  # type: ignore[arg-type]
    return None if chosen is None else chosen.node_id


def test_most_headroom_wins_and_unhealthy_or_draining_nodes_get_nothing() -> None:
    busy = NodeLoad("a", run_slots=4, running=4, queued=2)
    idle = NodeLoad("b", run_slots=2)
    assert pick([busy, idle]) == "b"
    assert pick([busy, NodeLoad("b", run_slots=2, healthy=False)]) == "a"
    assert pick([NodeLoad("a", run_slots=4, draining=True), NodeLoad("b", run_slots=1, healthy=False)]) is None
    # equal headroom: the shorter queue, then the id
    assert pick([NodeLoad("a", run_slots=4, running=1, queued=1), NodeLoad("b", run_slots=4, running=2)]) == "b"


def test_assigned_sessions_count_even_before_the_node_reports_them() -> None:
    nodes = [NodeLoad("a", run_slots=2, assigned=4), NodeLoad("b", run_slots=2, assigned=1)]
    assert pick(nodes) == "b"
    assert pick([NodeLoad("a", run_slots=2, assigned=4)]) is None  # 2 slots + 2 queued: full
    assert pick([NodeLoad("a", run_slots=2, assigned=2)], max_queued=0) is None


def test_a_burst_spreads_and_reservations_are_bounded() -> None:
    nodes = [NodeLoad("a", run_slots=8), NodeLoad("b", run_slots=8)]
    chosen = []
    for _ in range(6):
        node = choose_node(nodes, reservations=3)
        assert node is not None
        node.assigned += 1
        node.reserved += 1
        chosen.append(node.node_id)
    assert chosen == ["a", "b", "a", "b", "a", "b"]
    assert choose_node(nodes, reservations=3) is None  # both wait for their next heartbeat


def test_a_retry_avoids_the_node_of_the_lost_attempt_when_it_can() -> None:
    nodes = [NodeLoad("a", run_slots=8), NodeLoad("b", run_slots=2, running=1)]
    assert pick(nodes, avoid="a") == "b"
    assert pick([NodeLoad("a", run_slots=8)], avoid="a") == "a"
