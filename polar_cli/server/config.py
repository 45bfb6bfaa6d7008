"""The rollout service's configuration (pure models): the server, a gateway's link to it, and the topology file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from polar_cli.gateway.config import GatewayConfig
from polar_cli.models import StrictModel

Role = Literal["all", "server", "gateway"]
DB_NAME = "server.db"


class Backoff(StrictModel):
    """Retries with exponential backoff: ``initial_s``, times ``factor`` each time, up to ``max_s``; each try
    gives up after ``timeout_s``."""

    initial_s: PositiveFloat = 0.5
    max_s: PositiveFloat = 30.0
    factor: float = Field(default=2.0, ge=1.0)
    timeout_s: PositiveFloat = 10.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed tries in a row (``failures >= 1``)."""
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1))


class ServerConfig(StrictModel):
    """The rollout server: where it listens, its database, liveness, scheduling and trainer-callback settings."""

    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=0, le=65535)
    data_dir: Path = Field(default=Path("polar-data"), description=f"{DB_NAME} (SQLite, WAL) goes here")
    token: str | None = Field(default=None, description="the server token (default: $POLAR_TOKEN, else generated once)")
    heartbeat_interval_s: PositiveFloat = Field(default=5.0, description="how often gateways heartbeat")
    dead_after_intervals: float = Field(default=2.5, gt=1.0, description="a node silent this many intervals is dead")
    max_attempts: PositiveInt = Field(default=3, description="dispatches of one session before it fails")
    max_queued_per_node: int | None = Field(
        default=None, ge=0, description="sessions queued on a node beyond its run slots (default: its run slots)"
    )
    reservations_per_node: PositiveInt = Field(
        default=8, description="sessions sent to a node since its last heartbeat (bounds a burst onto one node)"
    )
    dispatch_timeout_s: PositiveFloat = Field(default=30.0, description="timeout of one call to a gateway")
    callbacks: Backoff = Field(default_factory=Backoff, description="retries of the trainer's callback_url")

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_NAME

    @property
    def dead_after_s(self) -> float:
        return self.heartbeat_interval_s * self.dead_after_intervals


class AgentConfig(StrictModel):
    """A gateway's link to its server: where it is, the token to register with, and how callbacks are retried."""

    server_url: str | None = None
    server_token: str | None = Field(default=None, description="default: $POLAR_SERVER_TOKEN")
    node_id: str | None = Field(default=None, description="default: kept in the data dir from the first register")
    retry: Backoff = Field(default_factory=lambda: Backoff(initial_s=0.2, max_s=5.0))


class ServeConfig(StrictModel):
    """``polar serve --config serve.yaml``: the role and the settings of each part (command-line flags win)."""

    role: Role = "all"
    drain_timeout_s: float = Field(
        default=0.0,
        ge=0.0,
        description="on a graceful stop, how long the gateway waits for sessions under way before cancelling them",
    )
    server: ServerConfig = Field(default_factory=ServerConfig)
    gateway: GatewayConfig = Field(default_factory=lambda: GatewayConfig(port=0))
    agent: AgentConfig = Field(default_factory=AgentConfig)
