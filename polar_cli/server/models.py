"""The rollout service's wire bodies (see docs/service.md): one typed model per request and answer."""

from __future__ import annotations

from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt

from polar_cli.ids import SessionId
from polar_cli.models import SessionResult, StrictModel, TaskState

ATTEMPT_KEY = "polar_attempt"
"""Metadata key that carries a session's attempt number to the gateway (and back in its SessionResult)."""


class SubmitAnswer(StrictModel):
    task_id: str
    status: TaskState


class NodeCapacity(StrictModel):
    run_slots: PositiveInt
    init_workers: PositiveInt | None = None
    postrun_workers: PositiveInt | None = None


class RegisterBody(StrictModel):
    """``POST /nodes/register`` (server token)."""

    url: str = Field(min_length=1)
    token: str = Field(min_length=1, description="the node's own token")
    node_id: SessionId | None = None
    capacity: NodeCapacity
    held_results: list[SessionId] = Field(default_factory=list, description="finished sessions not yet acknowledged")


class RegisterAnswer(StrictModel):
    node_id: str
    heartbeat_interval_s: float


class NodeLoadReport(StrictModel):
    run_slots: NonNegativeInt = 0
    running: NonNegativeInt = 0
    queued: NonNegativeInt = 0
    free_slots: NonNegativeInt = 0


class HeartbeatBody(StrictModel):
    """``POST /nodes/{node_id}/heartbeat`` (node token)."""

    load: NodeLoadReport = Field(default_factory=NodeLoadReport)
    sessions: list[SessionId] = Field(default_factory=list, description="sessions the node holds, unfinished")


class HeartbeatAnswer(StrictModel):
    ok: bool = True
    cancel: list[str] = Field(default_factory=list)


class SessionResultBody(StrictModel):
    """``POST /callbacks/session_result`` (node token)."""

    node_id: str
    session_id: SessionId
    attempt: PositiveInt = 1
    result: SessionResult


class SessionResultAnswer(StrictModel):
    accepted: bool = True
    duplicate: bool = False


class NodeStatus(StrictModel):
    node_id: str
    url: str
    healthy: bool
    draining: bool
    load: dict[str, Any]
    last_heartbeat: float | None


class ServiceStatus(StrictModel):
    """``GET /rollout/status``."""

    tasks: dict[str, int]
    nodes: list[NodeStatus]
    pending_sessions: int
    pending_callbacks: int = 0
