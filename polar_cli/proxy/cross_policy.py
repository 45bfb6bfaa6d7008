"""Cross-policy sampling (AgentRL): stale replicas, the updates they take, and the draw that sends a call to one.

A pool's replicas are ``current`` or ``stale`` (``PoolConfig.stale_replicas``). Current replicas take every weight
update; stale ones take only every ``stale_period``-th (:meth:`StaleSchedule.takes_next`), so between those they
serve older weights. Only a task that asks for cross-policy sampling (``agent.sampling.stale_fraction``) reaches
them: each of its model calls goes to a stale replica with that probability (:func:`draws_stale`), a fresh draw per
call. Every completion records the version of the replica that sampled it, so a trainer can correct the ratio.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def draws_stale(rng: random.Random, fraction: float | None) -> bool:
    """Whether one model call goes to a stale replica: true with probability ``fraction`` (None or 0: never)."""
    return bool(fraction) and rng.random() < fraction  # type: ignore[operator]


@dataclass
class StaleSchedule:
    """Which weight updates the stale replicas take: the ``period``-th, ``2 * period``-th, ... load of the pool
    (period 1: every load, so stale replicas never lag). A load that fails is not counted: loading again is the same
    update."""

    period: int
    loads: int = 0
    """Weight loads the pool completed."""

    def takes_next(self) -> bool:
        """Whether the stale replicas take the next load."""
        return (self.loads + 1) % self.period == 0

    def loaded(self) -> None:
        self.loads += 1
