"""Offline generation: ``polar generate`` runs a dataset's tasks on the rollout service into a resumable folder."""

from polar_cli.generate.ledger import Ledger, ResultRow, open_ledger
from polar_cli.generate.runner import GenerateOptions, GenerateProgress, embedded_serve_config, generate
from polar_cli.generate.stats import GroupStats, group_stats

__all__ = [
    "GenerateOptions",
    "GenerateProgress",
    "GroupStats",
    "Ledger",
    "ResultRow",
    "embedded_serve_config",
    "generate",
    "group_stats",
    "open_ledger",
]
