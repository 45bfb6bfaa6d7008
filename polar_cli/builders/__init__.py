"""Trajectory builders: recorded completions in, token-faithful training traces out.

``build_trajectory(strategy, completions, **config)`` looks the strategy up in the plugin registry (built-ins:
``per_request``, ``prefix_merging``); ``verify(trajectory, completions)`` checks the result independently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar_cli.builders.config import BuilderConfig
from polar_cli.builders.verify import VerificationReport, Violation, verify
from polar_cli.models import Completion, Trajectory


def build_trajectory(strategy: str, completions: Sequence[Completion], **config: Any) -> Trajectory:
    """Build one session's trajectory with the registered builder ``strategy``.

    ``config`` is the builder config (``BuilderSpec.config``): e.g. ``eos_token_id`` or ``tokenizer`` for
    ``prefix_merging``, ``session_id``/``task_id``/``harness``/``task_metadata`` for trace metadata,
    ``allow_retokenized``, ``status``, ``verify``.
    """
    from polar_cli.registry import get_builder  # the registry imports plugins, which import this package

    return get_builder(strategy).build(list(completions), **config)


__all__ = ["BuilderConfig", "VerificationReport", "Violation", "build_trajectory", "verify"]
