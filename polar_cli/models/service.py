"""The rollout service's trainer-facing wire models (docs/service.md): one definition each, used by the server and
the client. What the server and its gateways say to each other is ``polar_cli.node_protocol``.

Answers the server sends tolerate fields a newer server adds (pydantic's default ``extra="ignore"``), so an older
client keeps working; request bodies the server reads are strict (``StrictModel``: an unknown field is a 400).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from polar_cli.models.inference import PauseMode, PoolStatus
from polar_cli.models.session import SessionResult, TaskState, TaskStatus

TERMINAL_TASK_STATES: frozenset[TaskState] = frozenset({"completed", "failed", "cancelled"})


class SubmitAnswer(BaseModel):
    """``POST /rollout/task/submit``: the task's id and its state; ``created`` is False when a task with that id and
    the same body existed already (nothing new runs: ``status`` is how that task stands or ended)."""

    task_id: str
    status: TaskState
    created: bool = True


class NodeLoad(BaseModel):
    """A gateway's load: its run slots, what its last heartbeat said (running, queued, free slots) and the sessions the
    server has assigned to it and not seen finish. Fields a server leaves out are None."""

    run_slots: int = 0
    running: int = 0
    queued: int = 0
    free_slots: int | None = None
    assigned: int | None = None


class NodeStatus(BaseModel):
    """One gateway node in ``GET /rollout/status``."""

    node_id: str
    url: str
    healthy: bool
    draining: bool = False
    load: NodeLoad = Field(default_factory=NodeLoad)
    last_heartbeat: float | None = None


class ServiceStatus(BaseModel):
    """``GET /rollout/status``: tasks by state, the nodes, and sessions not yet dispatched."""

    tasks: dict[TaskState, int] = Field(default_factory=dict)
    nodes: list[NodeStatus] = Field(default_factory=list)
    pending_sessions: int = 0
    pending_callbacks: int | None = None  # trainer callbacks not yet acknowledged, when the server reports them


class GatewayPool(BaseModel):
    """One gateway in ``GET /inference``: its pool, or (``pool`` None) what it answered instead."""

    node_id: str
    url: str
    pool: PoolStatus | None = None
    error: str | None = None


class InferenceStatus(BaseModel):
    """``GET /inference`` and the answer of every ``/inference/...`` change: the server's policy version, whether
    sampling is paused (and how), and each live gateway's pool."""

    policy_version: int
    paused: PauseMode | None = None
    gateways: list[GatewayPool] = Field(default_factory=list)


class SessionResultCallback(BaseModel):
    """POSTed to a task's ``callback_url`` once per finished session (``Idempotency-Key: session_result:<id>``)."""

    type: Literal["session_result"] = "session_result"
    task_id: str
    session_id: str
    result: SessionResult


class TaskStatusCallback(BaseModel):
    """POSTed to a task's ``callback_url`` when the task ends (``Idempotency-Key: task_status:<task_id>``)."""

    type: Literal["task_status"] = "task_status"
    task_id: str
    status: TaskStatus


TrainerCallback = Annotated[SessionResultCallback | TaskStatusCallback, Field(discriminator="type")]
"""Either callback body; parse one with ``TRAINER_CALLBACK.validate_json(body)``."""

TRAINER_CALLBACK: TypeAdapter[SessionResultCallback | TaskStatusCallback] = TypeAdapter(TrainerCallback)
