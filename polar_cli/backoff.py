"""``Backoff``: how a client that retries without giving up waits between tries (the server's trainer callbacks, a
gateway's calls to its server)."""

from __future__ import annotations

from pydantic import Field, PositiveFloat

from polar_cli.models import StrictModel


class Backoff(StrictModel):
    """Retries with exponential backoff: ``initial_s``, times ``factor`` each time, up to ``max_s``; each try
    gives up after ``timeout_s``."""

    initial_s: PositiveFloat = 0.5
    max_s: PositiveFloat = 30.0
    factor: float = Field(default=2.0, ge=1.0)
    timeout_s: PositiveFloat = 10.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed tries in a row (``failures >= 1``)."""
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1))
