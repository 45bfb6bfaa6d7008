"""Which node gets the next session: healthy, non-draining nodes by pressure, with bounded reservations.

A node's view combines what the server knows (sessions it assigned there and has not seen finish) with what the node
last said in a heartbeat (run slots in use, sessions queued). ``reserved`` counts sessions sent since that heartbeat:
they are not in the node's own numbers yet, and at most ``reservations_per_node`` of them are allowed, so a burst of
submissions spreads across nodes instead of piling onto the one that looked idlest a moment ago.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class NodeView:
    """One node as the scheduler sees it (``RolloutServer`` merges its row and live state into one; ``GET
    /rollout/status`` reports the same view as a ``NodeLoad``)."""

    node_id: str
    run_slots: int
    healthy: bool = True
    draining: bool = False
    assigned: int = 0
    """Sessions the server has assigned to the node and not seen finish."""
    running: int = 0
    queued: int = 0
    """From the node's last heartbeat: harnesses running, sessions waiting in its queues."""
    reserved: int = 0
    """Sessions sent since the node's last heartbeat."""

    def headroom(self, max_queued: int | None) -> int:
        """How many more sessions the node should get: run slots plus allowed queue, minus its load."""
        allowed = self.run_slots + (self.run_slots if max_queued is None else max_queued)
        load = max(self.assigned, self.running + self.queued + self.reserved)
        return allowed - load


def choose_node(
    nodes: Iterable[NodeView],
    *,
    max_queued: int | None = None,
    reservations: int = 8,
    avoid: str | None = None,
) -> NodeView | None:
    """The node with the most headroom (then the shortest queue, then the id), or None when none can take one.

    ``avoid`` (the node of the session's previous attempt) is chosen only when no other node can take it.
    """
    eligible = [
        n for n in nodes if n.healthy and not n.draining and n.reserved < reservations and n.headroom(max_queued) > 0
    ]
    if not eligible:
        return None
    others = [n for n in eligible if n.node_id != avoid] or eligible
    return min(others, key=lambda n: (-n.headroom(max_queued), n.queued, n.node_id))
