"""The staged pipeline's configuration: pool sizes, buffers and default budgets."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from polar_cli.models import StrictModel


class PipelineConfig(StrictModel):
    """Sizes of the stage pools and the budgets a task does not set itself.

    Sessions wait for an INIT worker in an unbounded queue (submission is never refused); every later stage is
    bounded, so the number of live runtimes is at most ``init_workers + ready_capacity + run_slots +
    postrun_capacity + postrun_workers`` (with ``postrun_capacity`` unset, a run slot never waits and that part is
    bounded only by how many sessions were submitted).
    """

    init_workers: PositiveInt = Field(default=8, description="sessions starting a runtime / running prepare at once")
    ready_capacity: PositiveInt = Field(default=8, description="initialized runtimes buffered for a run slot")
    run_slots: PositiveInt = Field(default=8, description="harnesses running at once")
    postrun_workers: PositiveInt = Field(default=8, description="sessions building / evaluating / tearing down at once")
    postrun_capacity: PositiveInt | None = Field(
        default=None, description="sessions waiting for a POSTRUN worker; unset: unbounded (run slots never wait)"
    )
    init_timeout_seconds: float | None = Field(
        default=3600.0, gt=0, description="budget of INIT (runtime start + prepare actions)"
    )
    default_evaluation_seconds: float | None = Field(
        default=600.0, gt=0, description="evaluation budget when the task's evaluator.timeout_seconds is unset"
    )
    deadline_grace_seconds: float = Field(
        default=5.0, ge=0, description="how long after the agent deadline the pipeline cancels a run that ignores it"
    )
    teardown_timeout_seconds: float = Field(
        default=60.0, gt=0, description="a graceful teardown taking longer than this is redone immediately"
    )
    cancel_build_seconds: float = Field(
        default=30.0, gt=0, description="budget for building the partial trajectory of a cancelled session"
    )
    keep_finished: PositiveInt = Field(
        default=10_000, description="finished sessions kept in memory (older results are read from the store)"
    )
