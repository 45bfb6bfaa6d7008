"""Builder interface: recorded completions in, a trajectory of traces out.

The gateway calls :meth:`Builder.build` in POSTRUN with the task's ``BuilderSpec.config`` (the builder's own options,
which :meth:`Builder.check_config` validates when the task is submitted) and a :class:`BuildContext`: what the gateway
knows about the session (ids, harness, task metadata, how the run ended, the served model's tokenizer). The two never
mix: a user config names no session field, and the gateway never writes into a user config.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from polar_cli.interfaces.base import Component

if TYPE_CHECKING:
    from polar_cli.models import Completion, Trajectory, TrajectoryStatus

TokenizerSource = Literal["proxy", "server", "demo"]


@dataclass(frozen=True)
class BuildContext:
    """What a builder may know about the session beyond its completions (all optional: the Python API builds loose
    completions too, and then ids come from the completions themselves)."""

    session_id: str | None = None
    task_id: str | None = None
    harness: str | None = None
    task_metadata: Mapping[str, Any] = field(default_factory=dict)
    """The task's metadata (group_id, policy_version, rollout_step, ...), copied into every trace's metadata."""
    status: TrajectoryStatus = "completed"
    """How the harness run ended: ``completed``, ``timeout`` or ``error``."""
    tokenizer: str | None = None
    """The served model's tokenizer (a directory or hub id), when the gateway knows it; a builder's own
    ``tokenizer``/``eos_token_id`` config wins over it."""
    tokenizer_source: TokenizerSource | None = None
    """Where ``tokenizer`` came from: the proxy's ``--tokenizer`` (``proxy``), the inference server's model
    (``server``: vLLM's ``/v1/models`` root), or the scripted backend's demo tokenizer (``demo``)."""


class Builder(Component):
    """A trajectory-building strategy (``per_request``, ``prefix_merging``, ...)."""

    kind: ClassVar[str] = "builder"

    @abstractmethod
    def build(self, completions: list[Completion], config: Mapping[str, Any], context: BuildContext) -> Trajectory:
        """Turn one session's completions, in capture order, into a trajectory."""
