"""The node protocol's messages: one pydantic model per body and answer, in both directions.

Bodies a side reads are strict (``StrictModel``: an unknown field is a 400); answers tolerate fields a newer peer adds
(pydantic's default ``extra="ignore"``), so an older peer keeps working.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, PositiveInt

from polar_cli.ids import SessionId
from polar_cli.models.base import StrictModel
from polar_cli.models.inference import MAX_CONTROL_TIMEOUT_S, MAX_POLICY_VERSION, PauseMode
from polar_cli.models.limits import (
    MAX_COUNT,
    MAX_LISTED_SESSIONS,
    MAX_PATH_LENGTH,
    MAX_REPLICAS,
    MAX_RUN_SLOTS,
    MAX_URL_LENGTH,
    BoundedId,
    Count,
    HttpURL,
    NodeToken,
)
from polar_cli.models.service import Placement
from polar_cli.models.session import SessionResult
from polar_cli.models.task import TaskRequest

ATTEMPT_KEY = "polar_attempt"
"""The key under which a SessionResult's ``metadata`` records the attempt that produced it (a gateway writes it, the
server keeps it). On the wire the attempt is the typed ``attempt`` of each session sent; only the server's fallback
for gateways without ``POST /sessions/batch`` still carries it as ``task.metadata.polar_attempt``."""


# ---- server -> gateway: sessions ----------------------------------------------------------------------------------


class BatchSession(StrictModel):
    """One session of ``POST /sessions/batch``: its task (by id, from the batch's ``tasks``), sample and attempt."""

    task_id: str
    sample_index: int = Field(default=0, ge=0)
    session_id: SessionId
    attempt: PositiveInt | None = None
    """Which dispatch of the session this is (1 the first); a later attempt of a session that ended on the node runs
    it again. Recorded in its result's ``metadata.polar_attempt``."""


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


class SingleSession(StrictModel):
    """Body of a gateway's ``POST /sessions``: one session (one sample) of a task."""

    task: TaskRequest
    sample_index: int = Field(default=0, ge=0)
    session_id: SessionId | None = None
    attempt: PositiveInt | None = None
    """As ``BatchSession.attempt``."""


class SessionCreated(BaseModel):
    """``POST /sessions`` → 201: the session's id and where it stands."""

    session_id: str
    task_id: str | None = None
    sample_index: int = 0
    stage: str


class SessionInfo(BaseModel):
    """``GET /sessions/{id}`` on a gateway (the server's look-up): where the session is, and its result once it has
    one. A session the node keeps only in its result store has ``stage`` ``finished`` and a result, nothing else."""

    session_id: str
    stage: str
    task_id: str | None = None
    sample_index: int | None = None
    stage_seconds: dict[str, float] | None = None
    result: SessionResult | None = None


# ``DELETE /sessions/{id}`` (cancel) has no body; it answers the session's (``cancelled``) SessionResult.


# ---- server -> gateway: control (the inference pool) ---------------------------------------------------------------
# What the server tells every gateway about its inference pool: pause and resume, the policy version, loading weights,
# adding and removing replicas, cancelling stale sessions. Each is a model here, a method of ``GatewayClient``
# (``polar_cli.node_protocol.to_gateway``) and a route in ``polar_cli.gateway.app``; every answer that describes the
# pool is a ``polar_cli.models.inference.PoolStatus``.

PAUSE_TIMEOUT_S = 300.0
"""How long a pause (and the pause of a weight load) waits for the pool to be quiet, unless the caller says."""


class PauseBody(StrictModel):
    """``POST /inference/pause``: hold new model calls at the proxy; ``wait``: return when no call is in flight."""

    mode: PauseMode = "wait"
    timeout_s: float = Field(default=PAUSE_TIMEOUT_S, gt=0, le=MAX_CONTROL_TIMEOUT_S)


class ResumeBody(StrictModel):
    """``POST /inference/resume``: calls held go on, sampled under ``policy_version`` (default: the current one + 1
    on the server; a gateway is always told the number)."""

    policy_version: int | None = Field(default=None, ge=0, le=MAX_POLICY_VERSION)


class BackendBody(StrictModel):
    """``POST /inference/backends`` (add a replica) and ``DELETE /inference/backends`` (remove: drain, then drop)."""

    url: str = Field(min_length=1, max_length=MAX_URL_LENGTH)
    timeout_s: float = Field(
        default=PAUSE_TIMEOUT_S,
        gt=0,
        le=MAX_CONTROL_TIMEOUT_S,
        description="remove: how long its calls may take to end",
    )


class LoadWeightsBody(StrictModel):
    """``POST /inference/load_weights``: pause (wait), every replica reloads its weights from ``path`` (a path on
    the inference servers' machines) with the server's own mechanism, the version is set, the pool resumes."""

    path: str = Field(min_length=1, max_length=MAX_PATH_LENGTH)
    policy_version: int | None = Field(default=None, ge=0, le=MAX_POLICY_VERSION)
    timeout_s: float = Field(
        default=PAUSE_TIMEOUT_S, gt=0, le=MAX_CONTROL_TIMEOUT_S, description="bound on the pause and on each reload"
    )
    urls: list[Annotated[str, Field(max_length=MAX_URL_LENGTH)]] | None = Field(
        default=None,
        max_length=MAX_REPLICAS,
        description="gateway only: reload just these replicas (the server has each replica reloaded once)",
    )


class CancelStaleBody(StrictModel):
    """``POST /inference/cancel_stale``: cancel (status ``stale``) every running session whose oldest completion was
    sampled under a version older than ``older_than`` (default: the current version)."""

    older_than: int | None = Field(default=None, ge=0, le=MAX_POLICY_VERSION)


class CancelStaleAnswer(BaseModel):
    cancelled: list[str] = Field(default_factory=list, description="session ids cancelled as stale")


# ---- gateway -> server ----------------------------------------------------------------------------------------------


class NodeCapacity(StrictModel):
    run_slots: int = Field(ge=1, le=MAX_RUN_SLOTS)
    init_workers: int | None = Field(default=None, ge=1, le=MAX_RUN_SLOTS)
    postrun_workers: int | None = Field(default=None, ge=1, le=MAX_RUN_SLOTS)


class RegisterBody(StrictModel):
    """``POST /nodes/register`` (server token)."""

    url: HttpURL = Field(description="where the server reaches the node: http(s), a host")
    token: NodeToken = Field(description="the node's own token")
    node_id: SessionId | None = None
    capacity: NodeCapacity
    held_results: list[SessionId] = Field(
        default_factory=list, max_length=MAX_LISTED_SESSIONS, description="finished sessions not yet acknowledged"
    )
    placement: Placement | None = Field(default=None, description="its host, and its Slurm job and step if any")


class RegisterAnswer(BaseModel):
    """``POST /nodes/register``: the node's id (kept in its ``node.json``), how often it heartbeats, and the state of
    the inference pool it must take on (the server's policy version; whether sampling is paused)."""

    node_id: str
    heartbeat_interval_s: float
    policy_version: int | None = Field(default=None, ge=0, le=MAX_POLICY_VERSION)
    paused: PauseMode | None = None


class NodeLoadReport(StrictModel):
    run_slots: Count = 0
    running: Count = 0
    queued: Count = 0
    free_slots: Count = 0


class HeartbeatBody(StrictModel):
    """``POST /nodes/{node_id}/heartbeat`` (node token)."""

    load: NodeLoadReport = Field(default_factory=NodeLoadReport)
    sessions: list[SessionId] = Field(
        default_factory=list, max_length=MAX_LISTED_SESSIONS, description="sessions the node holds, unfinished"
    )
    draining: bool = Field(default=False, description="the node is stopping: send it nothing new")


class HeartbeatAnswer(BaseModel):
    """``POST /nodes/{node_id}/heartbeat``: sessions the node holds that it should not run (it cancels them)."""

    ok: bool = True
    cancel: list[str] = Field(default_factory=list)


class SessionResultBody(StrictModel):
    """``POST /callbacks/session_result`` (node token)."""

    node_id: BoundedId
    session_id: SessionId
    attempt: int = Field(default=1, ge=1, le=MAX_COUNT)
    result: SessionResult


class SessionResultAnswer(BaseModel):
    accepted: bool = True
    duplicate: bool = False
