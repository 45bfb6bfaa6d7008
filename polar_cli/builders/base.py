"""What both built-in builders do around their own ``_build``: parse the config, pause the GC, optionally verify."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.builders.common import gc_paused
from polar_cli.builders.config import BuilderConfig
from polar_cli.builders.verify import verify
from polar_cli.interfaces.builder import BuildContext, Builder
from polar_cli.models import Completion, Trajectory


class TraceBuilder(Builder):
    """A builder whose options are :class:`BuilderConfig` (strict: checked at submit by :meth:`check_config`), whose
    ``build`` runs with the cyclic GC paused (its collections would re-walk every token list of the session) and, with
    ``verify: true``, raises unless :func:`verify` passes."""

    options: ClassVar[type[BaseModel]] = BuilderConfig

    def build(self, completions: list[Completion], config: Mapping[str, Any], context: BuildContext) -> Trajectory:
        cfg: BuilderConfig = self.parse_config(config)
        with gc_paused():
            trajectory = self._build(completions, cfg, context)
            if cfg.verify:
                verify(trajectory, completions, raise_on_violation=True)
        return trajectory

    @abstractmethod
    def _build(self, completions: list[Completion], cfg: BuilderConfig, context: BuildContext) -> Trajectory:
        """The trajectory of ``completions`` under the parsed config."""
