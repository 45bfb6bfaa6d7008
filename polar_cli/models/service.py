"""The rollout service's trainer-facing wire models (docs/service.md): one definition each, used by the server and
the client. What the server and its gateways say to each other is ``polar_cli.node_protocol``.

Answers the server sends tolerate fields a newer server adds (pydantic's default ``extra="ignore"``), so an older
client keeps working; request bodies the server reads are strict (``StrictModel``: an unknown field is a 400).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from polar_cli.models.inference import PauseMode, PoolStatus
from polar_cli.models.rewards import RecentRewards
from polar_cli.models.session import SessionResult, TaskState, TaskStatus

TERMINAL_TASK_STATES: frozenset[TaskState] = frozenset({"completed", "failed", "cancelled"})
SessionState = Literal["pending", "dispatched", "running", "finished", "cancelled"]
"""Where a session stands on the server: waiting for a node, sent to one, running there (its node listed it in a
heartbeat), finished (its result committed), or cancelled with its task."""
THROUGHPUT_WINDOWS_S: tuple[int, ...] = (60, 300, 900)
"""The windows ``ServiceStatus.throughput`` reports: the last 1, 5 and 15 minutes."""


class SubmitAnswer(BaseModel):
    """``POST /rollout/task/submit``: the task's id and its state; ``created`` is False when a task with that id and
    the same body existed already (nothing new runs: ``status`` is how that task stands or ended)."""

    task_id: str
    status: TaskState
    created: bool = True


class AckAnswer(BaseModel):
    """``POST /rollout/task/{task_id}/ack``: the ended task is acknowledged (``acked_at``: the first time it was)."""

    task_id: str
    acked_at: float


class TaskList(BaseModel):
    """``GET /rollout/tasks?since=T``: the tasks that ended (completed, failed or cancelled) at or after ``since``
    (seconds since the epoch), oldest first (by submission)."""

    since: float
    task_ids: list[str] = Field(default_factory=list)


class NodeLoad(BaseModel):
    """A gateway's load: its run slots, what its last heartbeat said (running, queued, free slots) and the sessions the
    server has assigned to it and not seen finish. Fields a server leaves out are None."""

    run_slots: int = 0
    running: int = 0
    queued: int = 0
    free_slots: int | None = None
    assigned: int | None = None


class Placement(BaseModel):
    """Where a gateway runs, as its host and cluster scheduler name it (``polar_cli.gateway.placement`` reads it from
    the environment): sent when it registers, kept in its node row, shown by ``polar status``."""

    host: str = Field(
        max_length=256, description="SLURMD_NODENAME under Slurm, the node's IP under Ray, else the host name"
    )
    scheduler: Literal["slurm", "ray"] | None = Field(
        default=None, description="None: not started by a known scheduler"
    )
    job_id: str | None = Field(default=None, max_length=256, description="SLURM_JOB_ID")
    step_id: str | None = Field(default=None, max_length=256, description="SLURM_STEP_ID (srun's step)")
    node: str | None = Field(default=None, max_length=256, description="the scheduler's id of the node (Ray's node id)")

    def describe(self) -> str:
        """``slurm job 4242.0 on node017``, ``ray node 3f2a1b0c on 10.0.0.5``, or the host alone."""
        if self.scheduler == "ray" and self.node is not None:
            return f"ray node {self.node[:8]} on {self.host}"
        if self.scheduler is None or self.job_id is None:
            return self.host
        step = "" if self.step_id is None else f".{self.step_id}"
        return f"{self.scheduler} job {self.job_id}{step} on {self.host}"


class NodeStatus(BaseModel):
    """One gateway node in ``GET /rollout/status``."""

    node_id: str
    url: str
    healthy: bool
    draining: bool = False
    load: NodeLoad = Field(default_factory=NodeLoad)
    last_heartbeat: float | None = None
    heartbeat_age_s: float | None = None
    """Seconds since the server last heard a heartbeat from the node (by the server's own clock; None: none yet)."""
    placement: Placement | None = None
    """Where it runs, as it said when it registered (None: a gateway older than this field)."""


class Throughput(BaseModel):
    """Sessions finished (results committed) in the last ``window_s`` seconds, and the tokens the policy sampled in
    them (``sampled_tokens``: the trainable tokens of the results gateways reported since the server started)."""

    window_s: int
    finished: int = 0
    per_minute: float = 0.0
    sampled_tokens: int = 0


class DiskUsage(BaseModel):
    """The rollout server's data dir as last measured (``polar_cli.server.disk``): its database files, and the
    results and journals of its embedded gateway (role ``all``), in bytes."""

    measured_at: float
    db_bytes: int = 0
    """server.db with its WAL files, as on disk."""
    db_free_bytes: int = 0
    """Free pages inside server.db (what retention freed there, reused for new results before the file grows)."""
    results_bytes: int = 0
    journal_bytes: int = 0
    total_bytes: int = 0
    """db_bytes + results_bytes + journal_bytes."""
    data_bytes: int = 0
    """The task bodies and results stored in server.db (its indexes and free pages not counted)."""
    kept_bytes: int = 0
    """What retention's ``max_bytes`` is compared with: data_bytes + results_bytes + journal_bytes."""


class RetentionStatus(BaseModel):
    """What retention is set to do (``settings``, e.g. ``remove acknowledged tasks after 7d or over 50.0 GB``) and
    what it has done since the data dir was created."""

    settings: str
    compacted_tasks: int = 0
    removed_tasks: int = 0
    freed_bytes: int = 0
    """Results, task bodies and files retention removed or shrank."""
    last_run_at: float | None = None
    note: str | None = None
    """Why retention could not bring the data kept under ``max_bytes`` (nothing acknowledged left to act on)."""


class ServiceStatus(BaseModel):
    """``GET /rollout/status``: tasks by state, sessions by state, the nodes, throughput over the last minutes, and the
    reward statistics of the tasks that ended last (per task and per harness)."""

    tasks: dict[TaskState, int] = Field(default_factory=dict)
    nodes: list[NodeStatus] = Field(default_factory=list)
    pending_sessions: int = 0
    pending_callbacks: int | None = None  # trainer callbacks not yet acknowledged, when the server reports them
    sessions: dict[SessionState, int] = Field(default_factory=dict)
    throughput: list[Throughput] = Field(default_factory=list)
    server_time: float | None = None
    """The server's clock (Unix seconds) when it answered."""
    rewards: RecentRewards | None = None
    disk: DiskUsage | None = None
    retention: RetentionStatus | None = None


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


class StatusReport(ServiceStatus):
    """What ``polar status --json`` prints: the ``ServiceStatus`` and the server's ``InferenceStatus``
    (``inference_error`` says why the pools are missing when ``GET /inference`` failed)."""

    inference: InferenceStatus | None = None
    inference_error: str | None = None


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
