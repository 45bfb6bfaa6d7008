"""The rollout service's wire models (docs/service.md): one definition each, used by the server, the gateway agent
and the client.

Answers the server sends tolerate fields a newer server adds (pydantic's default ``extra="ignore"``), so an older
client keeps working; request bodies the server reads are strict (``StrictModel``: an unknown field is a 400).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, TypeAdapter

from polar_cli.ids import SessionId
from polar_cli.models.base import StrictModel
from polar_cli.models.session import SessionResult, TaskState, TaskStatus

TERMINAL_TASK_STATES: frozenset[TaskState] = frozenset({"completed", "failed", "cancelled"})

ATTEMPT_KEY = "polar_attempt"
"""Metadata key that carries a session's attempt number to the gateway (and back in its SessionResult)."""


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


# ---- the node protocol (gateway <-> server) ------------------------------------------------------------------------


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
    draining: bool = Field(default=False, description="the node is stopping: send it nothing new")


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


class BatchSession(StrictModel):
    """One session of ``POST /sessions/batch``: its task (by id, from the batch's ``tasks``), sample and attempt."""

    task_id: str
    sample_index: int = Field(default=0, ge=0)
    session_id: SessionId
    attempt: PositiveInt | None = None
    """Carried to the gateway as ``metadata.polar_attempt`` of the session's task (as ``POST /sessions`` does)."""


class SessionBatch(StrictModel):
    """Body of a gateway's ``POST /sessions/batch``: each task body once, then the sessions to create."""

    tasks: dict[str, dict[str, object]]
    """task_id → TaskRequest (as JSON): validated once per task, not once per session."""
    sessions: list[BatchSession]


class BatchSessionAnswer(BaseModel):
    """One session's answer in a batch: ``status`` is what ``POST /sessions`` would have answered for it alone
    (201 accepted; 400 the gateway cannot run the task; 503 draining; ...), ``error`` its message when refused."""

    session_id: str
    accepted: bool
    status: int
    error: str | None = None


class SessionBatchAnswer(BaseModel):
    """``POST /sessions/batch``: one answer per session, in the order sent."""

    sessions: list[BatchSessionAnswer]
