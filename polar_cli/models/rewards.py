"""Reward statistics over groups of sessions (one group: the sessions of one task), as every display shows them:
``polar status``, ``polar submit --wait``, ``polar generate``'s table, the dataset card, TensorBoard. Computed by
:func:`polar_cli.rewards.reward_stats` only. And reward shaping: what a task declares (:class:`RewardShaping`,
applied by :func:`polar_cli.trainers.shaping.shape_reward`) and what a result records of it (:class:`ShapedReward`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar_cli.models.base import StrictModel


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


AbnormalEnding = Literal["timeout", "limit", "error"]
"""Session endings that reward shaping may give a fixed reward: out of time, a limit hit, an error."""


class OverlongPenalty(StrictModel):
    """DAPO's soft overlong punishment over the session's sampled tokens (:func:`polar_cli.trainers.shaping.
    overlong_penalty` has the formula): no penalty up to ``budget - cache``, then a linear one down to ``-penalty``
    at ``budget``, ``-penalty`` past it."""

    budget: int = Field(ge=1, strict=True, description="L_max: sampled tokens over the whole session")
    cache: int = Field(
        default=0, ge=0, strict=True, description="L_cache: the soft zone before the budget (0: a hard penalty)"
    )
    penalty: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="the penalty at and past the budget")

    @model_validator(mode="after")
    def _cache_within_budget(self) -> OverlongPenalty:
        if self.cache > self.budget:
            raise ValueError(f"cache ({self.cache}) must not exceed budget ({self.budget})")
        return self


class RewardShaping(StrictModel):
    """``evaluator.shaping``: what the gateway does to the evaluator's reward before it is recorded (the reward of
    ``SessionResult``, its traces, exports and every statistic is the shaped one; ``SessionResult.shaping`` keeps the
    evaluator's). Unset fields change nothing."""

    timeout: float | None = Field(default=None, allow_inf_nan=False, description="the reward of a timeout session")
    limit: float | None = Field(
        default=None, allow_inf_nan=False, description="the reward of a session that hit one of agent.limits"
    )
    error: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="the reward of a session that ended in error (any error: harness, build or evaluation)",
    )
    overlong: OverlongPenalty | None = Field(
        default=None, description="a penalty added to the reward of a session that sampled more than a token budget"
    )

    def ending_reward(self, ending: AbnormalEnding) -> float | None:
        """The fixed reward of a session that ended ``ending``; None: its reward is not fixed."""
        match ending:
            case "timeout":
                return self.timeout
            case "limit":
                return self.limit
            case "error":
                return self.error


class ShapedReward(BaseModel):
    """``SessionResult.shaping``: how the task's :class:`RewardShaping` made the recorded reward."""

    model_config = ConfigDict(extra="forbid")

    evaluator_reward: float | None = Field(description="the evaluator's reward (None: the session was not scored)")
    reward: float | None = Field(description="the shaped reward, which the result records as its reward")
    ending: AbnormalEnding | None = Field(
        default=None, description="the abnormal ending whose fixed reward replaced the evaluator's"
    )
    overlong_penalty: float = Field(default=0.0, description="added to the evaluator's reward (0 or negative)")
    sampled_tokens: int = Field(default=0, description="the session's sampled tokens, over all its model calls")
