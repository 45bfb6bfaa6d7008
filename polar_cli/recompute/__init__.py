"""``polar verify``'s library: load traces from what Polar writes (``load_traces``), check them against their
journal (``check_structure``), and recompute their sampled tokens' logprobs under given weights (``recompute``,
needs the ``train`` extra). See docs/verify.md."""

from __future__ import annotations

from polar_cli.recompute.compare import KL_ESTIMATOR, DeltaStats, RecomputeReport, TraceDelta, recompute, token_versions
from polar_cli.recompute.inputs import LoadedTrace, load_traces
from polar_cli.recompute.structure import StructuralReport, StructuralViolation, check_structure

__all__ = [
    "KL_ESTIMATOR",
    "DeltaStats",
    "LoadedTrace",
    "RecomputeReport",
    "StructuralReport",
    "StructuralViolation",
    "TraceDelta",
    "check_structure",
    "load_traces",
    "recompute",
    "token_versions",
]
