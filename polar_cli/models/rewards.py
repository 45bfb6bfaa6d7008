"""Reward statistics over groups of sessions (one group: the sessions of one task), as every display shows them:
``polar status``, ``polar submit --wait``, ``polar generate``'s table, the dataset card, TensorBoard. Computed by
:func:`polar_cli.rewards.reward_stats` only."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RewardStats(BaseModel):
    """Rewards of finished sessions, and what they say about their groups (the sessions of one task each).

    ``mean`` / ``std`` (population standard deviation) are over the sessions with a reward; ``zero_variance`` counts
    the groups with a reward whose rewards are all equal (a single reward included): GRPO learns nothing from them.
    ``pass_at_k[k]`` is the unbiased estimator of Chen et al. 2021, ``1 - C(n-c, k) / C(n, k)`` for a group of ``n``
    finished sessions of which ``c`` were accepted, averaged over the groups with ``n >= k``."""

    sessions: int = Field(default=0, description="finished sessions")
    rewarded: int = Field(default=0, description="sessions with a reward")
    accepted: int = Field(default=0, description="accepted sessions (the 'correct' ones of pass@k)")
    mean: float | None = Field(default=None, description="mean reward (None: no reward yet)")
    std: float | None = Field(default=None, description="population standard deviation of the rewards")
    groups: int = Field(default=0, description="groups (tasks) with at least one finished session")
    rewarded_groups: int = Field(default=0, description="groups with at least one reward")
    zero_variance: int = Field(default=0, description="groups with a reward whose rewards are all equal")
    zero_variance_share: float | None = Field(default=None, description="zero_variance / rewarded_groups")
    pass_at_k: dict[int, float] = Field(default_factory=dict, description="k -> pass@k, k = 1 .. the largest group")


class TaskRewards(BaseModel):
    """One task's statistics (its sessions are one group) and the harness that ran it."""

    task_id: str
    harness: str | None = None
    stats: RewardStats


class HarnessRewards(BaseModel):
    """The statistics of every session a harness ran among the tasks shown (each task one group)."""

    harness: str
    tasks: int = 0
    stats: RewardStats


class RecentRewards(BaseModel):
    """``ServiceStatus.rewards``: the last tasks that ended since the server started (newest last), and their
    sessions per harness."""

    tasks: list[TaskRewards] = Field(default_factory=list)
    harnesses: list[HarnessRewards] = Field(default_factory=list)
