"""Trajectory builders: recorded completions in, token-faithful training traces out.

``build_trajectory(strategy, completions, context=..., **config)`` looks the strategy up in the plugin registry
(built-ins: ``per_request``, ``prefix_merging``); ``verify(trajectory, completions)`` checks the result independently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar_cli.builders.config import BuilderConfig
from polar_cli.builders.verify import VerificationReport, Violation, verify
from polar_cli.interfaces.builder import BuildContext
from polar_cli.models import Completion, Trajectory


def build_trajectory(
    strategy: str, completions: Sequence[Completion], *, context: BuildContext | None = None, **config: Any
) -> Trajectory:
    """Build one session's trajectory with the registered builder ``strategy``.

    ``config`` is the builder's own config (``BuilderSpec.config``): e.g. ``eos_token_id`` or ``tokenizer`` for
    ``prefix_merging``, ``allow_retokenized``, ``verify``. ``context`` says what is known about the session (ids,
    harness, task metadata, status, the served model's tokenizer); without one, ids come from the completions.
    """
    from polar_cli.registry import get_builder  # the registry imports plugins, which import this package

    return get_builder(strategy).build(list(completions), config, context or BuildContext())


__all__ = ["BuildContext", "BuilderConfig", "VerificationReport", "Violation", "build_trajectory", "verify"]
