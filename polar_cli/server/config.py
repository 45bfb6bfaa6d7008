"""The rollout server's configuration (a pure model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PositiveFloat, PositiveInt

from polar_cli.backoff import Backoff
from polar_cli.models import StrictModel
from polar_cli.models.inference import INITIAL_POLICY_VERSION, MAX_POLICY_VERSION
from polar_cli.server.retention import RetentionConfig

DB_NAME = "server.db"


class ServerConfig(StrictModel):
    """The rollout server: where it listens, its database, liveness, scheduling and trainer-callback settings."""

    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=0, le=65535)
    public_url: str | None = Field(
        default=None,
        description="the server's URL as other hosts reach it, written to the connect file (default: on a wildcard "
        "host, this host's name); without a port, the bound one",
    )
    data_dir: Path = Field(default=Path("polar-data"), description=f"{DB_NAME} (SQLite, WAL) goes here")
    token: str | None = Field(default=None, description="the server token (default: $POLAR_TOKEN, else generated once)")
    heartbeat_interval_s: PositiveFloat = Field(default=5.0, description="how often gateways heartbeat")
    dead_after_intervals: float = Field(default=2.5, gt=1.0, description="a node silent this many intervals is dead")
    max_attempts: PositiveInt = Field(default=3, description="dispatches of one session before it fails")
    max_queued_per_node: int | None = Field(
        default=None, ge=0, description="sessions queued on a node beyond its run slots (default: its run slots)"
    )
    reservations_per_node: PositiveInt | None = Field(
        default=None,
        description="deprecated and ignored: a dispatch round fills every node by headroom (max_queued_per_node)",
    )
    dispatch_timeout_s: PositiveFloat = Field(default=30.0, description="timeout of one call to a gateway")
    callbacks: Backoff = Field(default_factory=Backoff, description="retries of the trainer's callback_url")
    initial_policy_version: int = Field(
        default=INITIAL_POLICY_VERSION,
        ge=0,
        le=MAX_POLICY_VERSION,
        description="the policy version of a fresh data dir (a restart keeps its own)",
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig,
        description="what of the tasks a trainer acknowledged may be compacted or removed (default: keep everything)",
    )

    def notes(self) -> list[str]:
        """What the operator should know about this config: settings that are kept only so old files still load."""
        if self.reservations_per_node is None:
            return []
        return [
            "server.reservations_per_node is deprecated and ignored: sessions are dispatched as soon as a node has "
            "headroom (run slots plus max_queued_per_node), spread over the nodes in one round; remove it"
        ]

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_NAME

    @property
    def dead_after_s(self) -> float:
        return self.heartbeat_interval_s * self.dead_after_intervals
