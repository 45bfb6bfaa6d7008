"""Which nodes get the pending sessions: healthy, non-draining nodes, filled by headroom in one round.

A node's headroom is its run slots plus its allowed queue, minus the sessions the server has sent it and not seen
finish (``assigned``). That count is the server's own and always current: a session result (the node's callback)
lowers it at once, so a freed slot is refilled in the next dispatch round, not at the next heartbeat. A heartbeat's
``running`` and ``queued`` are reported in the status, never added to the load: they are a snapshot that may still
count sessions whose results have arrived since.

A round gives each session to the node with the most headroom left (water-filling), so a burst spreads over the
nodes rather than piling onto the one that looked idlest, and fills every free slot of every node at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
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
    """Sessions the server has sent to the node and not seen finish: the load headroom is counted from."""
    running: int = 0
    queued: int = 0
    """From the node's last heartbeat: harnesses running, sessions waiting in its queues (reported, not counted)."""

    def headroom(self, max_queued: int | None) -> int:
        """How many more sessions the node should get: run slots plus allowed queue, minus what it was sent."""
        allowed = self.run_slots + (self.run_slots if max_queued is None else max_queued)
        return allowed - self.assigned

    def can_take(self, max_queued: int | None) -> bool:
        return self.healthy and not self.draining and self.headroom(max_queued) > 0


def spread(nodes: Iterable[NodeView], avoid: Sequence[str | None], *, max_queued: int | None = None) -> list[NodeView]:
    """A node for each session in turn (``avoid[i]``: the node of session ``i``'s lost attempt, or None), until no
    node can take more; each chosen node's ``assigned`` is counted up.

    Each session goes to the node with the most headroom left (then the lowest id); the node in ``avoid`` only when no
    other node can take it. A heap keeps a round at O(log nodes) per session.
    """
    views = [n for n in nodes if n.can_take(max_queued)]
    heap = [(-n.headroom(max_queued), n.node_id, i) for i, n in enumerate(views)]
    heapq.heapify(heap)
    chosen: list[NodeView] = []
    for avoided in avoid:
        if not heap:
            break
        best = heapq.heappop(heap)
        if views[best[2]].node_id == avoided and heap:
            other = heapq.heappop(heap)
            heapq.heappush(heap, best)
            best = other
        node = views[best[2]]
        node.assigned += 1
        if node.headroom(max_queued) > 0:
            heapq.heappush(heap, (-node.headroom(max_queued), node.node_id, best[2]))
        chosen.append(node)
    return chosen
