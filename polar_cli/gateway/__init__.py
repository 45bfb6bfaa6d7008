"""The gateway's staged session pipeline (INIT -> READY -> RUNNING -> POSTRUN) and its durable result store."""

from polar_cli.gateway.config import PipelineConfig
from polar_cli.gateway.driver import SessionDriver
from polar_cli.gateway.jobs import Built, RunOutcome, SessionBudget, SessionJob, SessionResources, Stage
from polar_cli.gateway.pipeline import StagedPipeline
from polar_cli.gateway.results import ResultStore

__all__ = [
    "Built",
    "PipelineConfig",
    "ResultStore",
    "RunOutcome",
    "SessionBudget",
    "SessionDriver",
    "SessionJob",
    "SessionResources",
    "Stage",
    "StagedPipeline",
]
