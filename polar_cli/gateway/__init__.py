"""A gateway node: the staged session pipeline (INIT -> READY -> RUNNING -> POSTRUN) and its durable result store.

``config`` (pure models), ``app`` (the HTTP routes), ``node`` (lifecycle and Python API), ``embedded`` (``polar run``'s
node for one task), ``agent`` (the link to a rollout server). It speaks to the server only through
``polar_cli.node_protocol`` and imports nothing from ``polar_cli.server``.
"""

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
