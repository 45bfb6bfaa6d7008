"""Builder interface: recorded completions in, a trajectory of traces out."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from polar_cli.interfaces.base import Component
from polar_cli.models import Completion, Trajectory


class Builder(Component):
    """A trajectory-building strategy (``per_request``, ``prefix_merging``, ...)."""

    kind: ClassVar[str] = "builder"

    @abstractmethod
    def build(self, completions: list[Completion], **config: Any) -> Trajectory:
        """Turn one session's completions, in capture order, into a trajectory."""
