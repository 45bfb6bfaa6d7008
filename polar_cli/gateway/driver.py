"""The seam between the pipeline (scheduling, budgets, cancellation, results) and the work of each stage."""

from __future__ import annotations

from typing import Protocol

from polar_cli.gateway.jobs import Built, RunOutcome, SessionJob
from polar_cli.interfaces.evaluator import EvaluationResult
from polar_cli.models import Completion, Trajectory


class SessionDriver(Protocol):
    """What each stage does for one session. The pipeline owns timing; a driver only does the work.

    Contract:

    - ``init``: start the runtime, run the task's prepare actions; keep handles in ``job.resources``. Raise on
      failure.
    - ``run``: run the harness until it ends or ``deadline`` (``time.monotonic()``, or ``None``) passes and say how
      it ended. The pipeline cancels the call ``deadline_grace_seconds`` after the deadline if it has not returned,
      and then treats the run as ``timeout``; cancellation must kill what the run started.
    - ``collect``: stop recording the session's model calls and return what was captured (idempotent). The pipeline
      keeps it in ``job.completions``, so a result reports them even when the build fails.
    - ``build``: the trajectory built from the collected completions. Like ``collect`` it must not need the runtime:
      both are also called (best effort) after a cancelled session's runtime is gone, to salvage its partial traces.
    - ``evaluate``: score the session before ``deadline``; the pipeline cancels it at the deadline.
    - ``teardown``: free everything the session holds (runtimes, proxy session). Called for every session, whatever
      stage it reached (also when ``init`` never ran), possibly twice (graceful, then ``immediate`` when the graceful
      one is too slow): it must be idempotent. ``immediate`` means kill now (cancellation, errors).

    Exceptions other than ``asyncio.CancelledError`` become an ``error`` result naming the stage; a ``run`` that raises
    still goes through POSTRUN so whatever was captured is kept.
    """

    async def init(self, job: SessionJob) -> None: ...

    async def run(self, job: SessionJob, deadline: float | None) -> RunOutcome: ...

    async def collect(self, job: SessionJob) -> list[Completion]: ...

    async def build(self, job: SessionJob, outcome: RunOutcome, completions: list[Completion]) -> Trajectory: ...

    async def evaluate(
        self, job: SessionJob, outcome: RunOutcome, built: Built, deadline: float | None
    ) -> EvaluationResult: ...

    async def teardown(self, job: SessionJob, *, immediate: bool) -> None: ...
