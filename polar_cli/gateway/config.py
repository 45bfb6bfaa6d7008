"""A gateway's configuration (pure models): the node (``GatewayConfig``), its staged pipeline (``PipelineConfig``:
pool sizes, buffers and default budgets), its sweeps of runtime leftovers (``RuntimeGcConfig``) and its link to a
rollout server (``AgentConfig``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from polar_cli.backoff import Backoff
from polar_cli.ids import SessionId
from polar_cli.models import StrictModel
from polar_cli.models.limits import MAX_RUN_SLOTS, NodeToken
from polar_cli.proxy import ProxyConfig
from polar_cli.runtimes.pool import SandboxPoolConfig
from polar_cli.web.auth import new_token


class PipelineConfig(StrictModel):
    """Sizes of the stage pools and the budgets a task does not set itself.

    Sessions wait for an INIT worker in an unbounded queue (submission is never refused); every later stage is
    bounded, so the number of live runtimes is at most ``init_workers + ready_capacity + run_slots +
    postrun_capacity + postrun_workers`` (with ``postrun_capacity`` unset, a run slot never waits and that part is
    bounded only by how many sessions were submitted).
    """

    init_workers: PositiveInt = Field(
        default=8, le=MAX_RUN_SLOTS, description="sessions starting a runtime / running prepare at once"
    )
    ready_capacity: PositiveInt = Field(default=8, description="initialized runtimes buffered for a run slot")
    run_slots: PositiveInt = Field(default=8, le=MAX_RUN_SLOTS, description="harnesses running at once")
    postrun_workers: PositiveInt = Field(
        default=8, le=MAX_RUN_SLOTS, description="sessions building / evaluating / tearing down at once"
    )
    postrun_capacity: PositiveInt | None = Field(
        default=None, description="sessions waiting for a POSTRUN worker; unset: unbounded (run slots never wait)"
    )
    init_timeout_seconds: float | None = Field(
        default=3600.0, gt=0, description="budget of INIT (runtime start + prepare actions)"
    )
    default_evaluation_seconds: float | None = Field(
        default=600.0, gt=0, description="evaluation budget when the task's evaluator.timeout_seconds is unset"
    )
    deadline_grace_seconds: float = Field(
        default=5.0, ge=0, description="how long after the agent deadline the pipeline cancels a run that ignores it"
    )
    teardown_timeout_seconds: float = Field(
        default=60.0, gt=0, description="a graceful teardown taking longer than this is redone immediately"
    )
    cancel_build_seconds: float = Field(
        default=30.0, gt=0, description="budget for building the partial trajectory of a cancelled session"
    )
    keep_finished: PositiveInt = Field(
        default=10_000, description="finished sessions kept in memory (older results are read from the store)"
    )
    sandbox_pool: SandboxPoolConfig = Field(
        default_factory=SandboxPoolConfig,
        description="warm sandboxes per runtime spec taken by INIT, and where reused ones wait (max 0: off)",
    )


class RuntimeGcConfig(StrictModel):
    """The node's sweeps of what its runtimes left behind (``polar_cli.gateway.sweeps``)."""

    at_start: bool = Field(
        default=True, description="before taking sessions, remove what an earlier run of this node left behind"
    )
    interval_seconds: float | None = Field(
        default=600.0, gt=0, description="how often the TTL sweep runs; null: never"
    )
    ttl_seconds: float = Field(
        default=3600.0, gt=0, description="the TTL sweep removes this node's things older than this that no live "
        "session of this gateway holds",
    )


class GatewayConfig(StrictModel):
    """One gateway node: where it listens, where it keeps data, its pools and its proxy's backend."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0: any free port (several gateways on one host)")
    public_url: str | None = Field(
        default=None,
        description="the node's URL as the server and runtimes reach it (default: where it listens); without a port,"
        " the port it bound",
    )
    data_dir: Path = Field(default=Path("polar-data"), description="results/ and journal/ go here")
    scratch_root: Path | None = Field(default=None, description="runtimes' per-session host dirs (default: $TMPDIR)")
    control_token: NodeToken = Field(
        default_factory=new_token, description="Bearer token of every control route (the proxy's too); generated"
    )
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    runtime_gc: RuntimeGcConfig = Field(default_factory=RuntimeGcConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig, description="backend options; host/port are not used")
    backend_check: Literal["fail", "warn", "off"] = Field(
        default="warn",
        description="at start-up, ask the backend (GET /v1/models; a busy one for up to proxy.backend_check_timeout_s,"
        " polar_cli.gateway.backend_check): fail "
        "(polar run, polar generate: an unreachable backend stops before any session), warn (log it and serve: "
        "the inference server may still be loading), off",
    )

    @field_validator("control_token", mode="before")
    @classmethod
    def _token(cls, value: Any) -> Any:
        return value or new_token()  # never open: a missing token is a generated one

    @property
    def results_dir(self) -> Path:
        """Where each session's SessionResult is kept (``polar_cli.gateway.results.ResultStore``)."""
        return self.data_dir / "results"

    @property
    def journal_dir(self) -> Path:
        """Where each session's Completions are journaled (the proxy's ``journal_dir``, default ``journal/``)."""
        return self.proxy.journal_dir or self.data_dir / "journal"

    def proxy_config(self) -> ProxyConfig:
        return self.proxy.model_copy(update={"journal_dir": self.journal_dir, "control_token": self.control_token})


class AgentConfig(StrictModel):
    """A gateway's link to its server: where it is, the token to register with, and how callbacks are retried."""

    server_url: str | None = None
    server_token: str | None = Field(default=None, description="default: $POLAR_SERVER_TOKEN")
    node_id: SessionId | None = Field(default=None, description="default: kept in the data dir from the first register")
    retry: Backoff = Field(default_factory=lambda: Backoff(initial_s=0.2, max_s=5.0))
    register_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="at start, how long a server that cannot be reached (or answers 5xx) is retried before the "
        "gateway exits naming its URL and the cause; a refusal (wrong token, node id in use) exits at once",
    )
