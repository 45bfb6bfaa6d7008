"""Session and task outcomes reported to callers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar_cli.models.rewards import RewardStats, ShapedReward
from polar_cli.models.trace import Trajectory, TrajectoryStatus


class SessionResult(BaseModel):
    """The terminal result of one session, written to disk before anyone is told."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    task_id: str | None = None
    sample_index: int = 0
    status: TrajectoryStatus
    trajectory: Trajectory
    reward: float | None = None
    shaping: ShapedReward | None = Field(
        default=None, description="how the task's evaluator.shaping made ``reward`` (None: the task declares none)"
    )
    num_completions: int = 0
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    harness_stderr: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


TaskState = Literal["pending", "running", "completed", "failed", "cancelled"]


class TaskStatus(BaseModel):
    """Progress of a task across its sessions."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    state: TaskState
    num_samples: int
    sessions: dict[str, str] = Field(default_factory=dict, description="session_id -> session status")
    completed: int = 0
    failed: int = 0
    results: list[SessionResult] = Field(default_factory=list)
    created_at: float | None = None
    updated_at: float | None = None
    error: str | None = Field(
        default=None, description="why a failed task failed, where one cause explains it (every session no_model_call)"
    )
    harness: str | None = Field(default=None, description="the task's agent.harness")
    rewards: RewardStats | None = Field(
        default=None, description="the finished sessions' reward statistics (the task is one group; None: not asked)"
    )
    acked_at: float | None = Field(
        default=None, description="when a trainer acknowledged the ended task (its ack, or its last callback delivered)"
    )
    retention: Literal["compacted"] | None = Field(
        default=None, description="compacted: retention dropped the results' traces (their summaries stay)"
    )
