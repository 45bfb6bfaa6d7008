"""The staged pipeline: overlap of stages, the deadline and partial traces, cancellation, crashes, durability, metrics.

Stage work is a simulated driver (tests/gateway/sim.py); the pipeline, the result store and the evaluator are real.
No assertion depends on how long anything took: overlap and slot occupancy are checked by counting.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import ConfigError, RuntimeFailure, SessionError
from polar_cli.gateway import PipelineConfig, ResultStore, SessionBudget, SessionJob, Stage, StagedPipeline
from polar_cli.models import AgentSpec, EvaluatorSpec, SessionResult, TaskRequest, validate_model
from tests.gateway.sim import SimDriver, until


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def config(**overrides: Any) -> PipelineConfig:
    base: dict[str, Any] = dict(init_workers=2, ready_capacity=2, run_slots=2, postrun_workers=2)
    return PipelineConfig(**(base | overrides))


# ---- stages overlap ---------------------------------------------------------------------------------------------


def overlaps(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def test_slow_init_and_postrun_overlap_with_running_and_slots_never_wait_for_init() -> None:
    """INIT and POSTRUN take twice as long as RUNNING; with enough INIT/POSTRUN workers the run slots stay busy."""
    sessions = 24
    driver = SimDriver(sleeps={"init": 0.1, "run": 0.05, "evaluate": 0.1})
    pipeline = StagedPipeline(driver, config(init_workers=8, ready_capacity=3, run_slots=2, postrun_workers=8))
    handoffs: list[tuple[int, int, int]] = []  # at each run end: sessions READY, not yet started, in the INIT queue

    def on_run_end(job: SessionJob) -> None:
        stages = [j.stage for j in pipeline.active()]
        not_started = sum(s in (Stage.INIT_QUEUED, Stage.INIT, Stage.READY) for s in stages)
        handoffs.append((stages.count(Stage.READY), not_started, stages.count(Stage.INIT_QUEUED)))

    driver.on_run_end = on_run_end

    async def body() -> list[SessionJob]:
        async with pipeline:
            jobs = [await pipeline.submit(SessionJob(f"s{i}")) for i in range(sessions)]
            for job in jobs:
                await pipeline.wait(job.session_id)
            return jobs

    jobs = run(body())
    assert all(job.result is not None and job.result.status == "completed" for job in jobs)

    init = {j.session_id: j.interval("init_started", "init_finished") for j in jobs}
    running = {j.session_id: j.interval("run_started", "run_finished") for j in jobs}
    postrun = {j.session_id: j.interval("postrun_started", "evaluate_finished") for j in jobs}
    pairs = [(a.session_id, b.session_id) for a in jobs for b in jobs if a is not b]
    init_during_run = sum(1 for a, b in pairs if overlaps(init[a], running[b]))
    post_during_run = sum(1 for a, b in pairs if overlaps(postrun[a], running[b]))
    assert init_during_run > 0 and post_during_run > 0  # sessions are in different stages at the same time
    # never more than run_slots sessions RUNNING at once (sweep over start/end events, ends first on ties)
    events = sorted((t, delta) for span in running.values() if span for t, delta in ((span[0], 1), (span[1], -1)))
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert peak == 2

    # Slot occupancy by counting: whenever a run slot freed while sessions were still waiting to be initialized, an
    # initialized session was already waiting in READY, so no slot ever waited for INIT.
    busy_handoffs = [h for h in handoffs if h[2] > 0]
    assert busy_handoffs, "the test never observed a hand-off under load"
    assert all(ready > 0 for ready, _, _ in busy_handoffs), handoffs
    assert len(handoffs) == sessions


# ---- deadline and partial traces ------------------------------------------------------------------------------


def test_harness_that_stops_answering_after_two_calls_ends_timeout_with_both_calls() -> None:
    driver = SimDriver(calls=2, hang_after_calls=True)
    pipeline = StagedPipeline(driver, config(deadline_grace_seconds=0))

    async def body() -> SessionResult:
        async with pipeline:
            return await pipeline.run(SessionJob("t1", budget=SessionBudget(agent_seconds=0.3)))

    result = run(body())
    assert result.status == "timeout"
    assert result.num_completions == 2
    assert len(result.trajectory.traces) == 2
    assert result.trajectory.status == "timeout"
    assert [t.prompt_ids for t in result.trajectory.traces] == [[1, 2, 3], [1, 2, 4]]
    assert result.reward == 0.0 and all(t.reward == 0.0 for t in result.trajectory.traces)  # evaluated: POSTRUN ran
    assert "budget of 0.3 s" in (result.error or "")
    assert {"running", "build", "evaluate", "teardown"} <= set(result.stage_seconds)
    assert driver.teardowns == [("t1", False)]
    assert driver.live == set()


def test_a_run_that_reports_its_own_timeout_keeps_that_status_and_its_traces() -> None:
    driver = SimDriver(calls=3, run_status="timeout")

    async def body() -> SessionResult:
        async with StagedPipeline(driver, config()) as pipeline:
            return await pipeline.run(SessionJob("t2", budget=SessionBudget(agent_seconds=100.0)))

    result = run(body())
    assert result.status == "timeout" and result.num_completions == 3 and len(result.trajectory.traces) == 3
    assert result.harness_stderr == "sim stderr"
    assert driver.deadlines["t2"] is not None  # the driver was given the one deadline


def test_evaluation_has_its_own_budget() -> None:
    driver = SimDriver(calls=1)
    driver.hold("evaluate", "e1")  # never released: evaluation overruns its budget

    async def body() -> SessionResult:
        async with StagedPipeline(driver, config()) as pipeline:
            budget = SessionBudget(agent_seconds=100.0, evaluation_seconds=0.2)
            return await pipeline.run(SessionJob("e1", budget=budget))

    result = run(body())
    assert result.status == "error" and "evaluation exceeded its budget of 0.2 s" in (result.error or "")
    assert len(result.trajectory.traces) == 1 and result.reward is None  # the traces survive
    assert result.metadata["run_status"] == "completed"
    assert driver.teardowns == [("e1", False)]


def test_budget_for_task() -> None:
    task = TaskRequest(
        task_id="t",
        instruction="x",
        timeout_seconds=100,
        agent=AgentSpec(harness="shell", timeout_seconds=40),
        evaluator=EvaluatorSpec(timeout_seconds=7),
    )
    budget = SessionBudget.for_task(task, PipelineConfig())
    assert (budget.agent_seconds, budget.evaluation_seconds) == (40, 7)
    plain = TaskRequest(task_id="t", instruction="x", agent=AgentSpec(harness="shell"))
    budget = SessionBudget.for_task(plain, PipelineConfig(default_evaluation_seconds=99))
    assert (budget.agent_seconds, budget.evaluation_seconds) == (1800, 99)


# ---- cancellation in every stage --------------------------------------------------------------------------------

# (stage to cancel in, how to hold sessions there): "blocker" sessions occupy the pools so the victim waits in queues
CANCEL_CASES: dict[str, dict[str, Any]] = {
    "init_queued": dict(cfg=dict(init_workers=1), hold=[("init", "b")], blockers={"b": Stage.INIT}),
    "init": dict(cfg={}, hold=[("init", "v")], blockers={}),
    "ready": dict(cfg=dict(run_slots=1), hold=[("run", "b")], blockers={"b": Stage.RUNNING}),
    "ready_blocked": dict(
        cfg=dict(run_slots=1, ready_capacity=1), hold=[("run", "b")], blockers={"b": Stage.RUNNING, "c": Stage.READY}
    ),
    "running": dict(cfg={}, hold=[("run", "v")], blockers={}),
    "postrun_queued": dict(cfg=dict(postrun_workers=1), hold=[("evaluate", "b")], blockers={"b": Stage.POSTRUN}),
    "postrun": dict(cfg={}, hold=[("evaluate", "v")], blockers={}),
}
EXPECTED_STAGE = {"ready_blocked": Stage.READY, "postrun": Stage.POSTRUN}


@pytest.mark.parametrize("where", list(CANCEL_CASES))
def test_cancel_in_every_stage_frees_the_runtime_at_once_and_yields_a_result(where: str, tmp_path: Path) -> None:
    case = CANCEL_CASES[where]
    driver = SimDriver(calls=1)
    gates = [driver.hold(stage, sid) for stage, sid in case["hold"]]
    store = ResultStore(tmp_path)
    pipeline = StagedPipeline(driver, config(**case["cfg"]), store=store)
    blockers: dict[str, Stage] = case["blockers"]
    expected = EXPECTED_STAGE[where] if where in EXPECTED_STAGE else Stage(where)

    async def body() -> tuple[SessionResult, list[SessionResult]]:
        async with pipeline:
            for sid, stage in blockers.items():
                blocker = await pipeline.submit(SessionJob(sid))
                await until(
                    lambda blocker=blocker, stage=stage: blocker.stage is stage
                    and (stage is not Stage.READY or len(pipeline._ready) == 1)  # in the buffer, not on its way
                )
            victim = await pipeline.submit(SessionJob("v"))
            await until(lambda: victim.stage is expected, f"v in {expected}")
            if where == "ready_blocked":
                assert len(pipeline._ready) == 1 and victim not in pipeline._ready._items  # an INIT worker holds it
            result = await pipeline.cancel("v", "test says stop")
            # the victim's runtime is gone while the blockers still hold every worker it waited for
            assert ("v", True) in driver.teardowns and "v" not in driver.live
            assert all(pipeline.get(sid).result is None for sid in blockers)
            for gate in gates:
                gate.set()
            others = [await pipeline.wait(sid) for sid in blockers]
            return result, others

    result, others = run(body())
    assert result.status == "cancelled" and result.error == "test says stop"
    assert result.trajectory.status == "cancelled"
    assert store.read("v") == result
    reached_run = where in ("running", "postrun_queued", "postrun")
    assert len(result.trajectory.traces) == (1 if reached_run else 0)  # partial traces salvaged once it ran
    assert result.reward is None
    assert all(o.status == "completed" for o in others)
    assert driver.live == set()
    assert [sid for sid, _ in driver.teardowns].count("v") == 1


def test_cancel_twice_and_after_the_end_returns_the_same_result() -> None:
    driver = SimDriver()
    gate = driver.hold("run", "c1")

    async def body() -> None:
        async with StagedPipeline(driver, config()) as pipeline:
            await pipeline.submit(SessionJob("c1"))
            await until(lambda: driver.entered[("run", "c1")].is_set())
            first, second = await asyncio.gather(pipeline.cancel("c1"), pipeline.cancel("c1", "again"))
            assert first is second and first.status == "cancelled"
            assert await pipeline.cancel("c1") is first
            gate.set()
            done = await pipeline.run(SessionJob("c2"))
            assert (await pipeline.cancel("c2")).status == "completed"  # already finished: its own result
            assert done.status == "completed"

    run(body())


def test_closing_the_pipeline_cancels_what_is_in_flight() -> None:
    driver = SimDriver()
    driver.hold("run", "a")
    driver.hold("init", "b")
    driver.hold("evaluate", "c")

    async def body() -> list[SessionJob]:
        pipeline = StagedPipeline(driver, config(init_workers=1))
        await pipeline.start()
        jobs = [await pipeline.submit(SessionJob(sid)) for sid in ("a", "c", "b", "d")]
        await until(lambda: all(driver.entered[key].is_set() for key in driver.gates))
        await pipeline.close()
        with pytest.raises(SessionError):
            await pipeline.submit(SessionJob("late"))
        return jobs

    jobs = run(body())
    assert [j.result.status for j in jobs if j.result] == ["cancelled"] * 4  # d waits behind b for INIT
    assert all("shutting down" in (j.result.error or "") for j in jobs if j.result)
    assert driver.live == set()


# ---- crashes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "message", "traces", "reward", "completions"),
    [
        ("init", "init failed: runtime would not start", 0, None, 0),
        ("run", "run failed: ValueError: boom", 1, 0.0, 1),
        ("build", "build failed: ValueError: boom", 0, None, 1),  # the build failed; the captured calls still count
        ("evaluate", "evaluation failed: ValueError: boom", 1, None, 1),
    ],
)
def test_a_crash_in_a_stage_ends_error_with_teardown_and_a_result(
    stage: str, message: str, traces: int, reward: float | None, completions: int, tmp_path: Path
) -> None:
    exc: Exception = RuntimeFailure("runtime would not start") if stage == "init" else ValueError("boom")
    driver = SimDriver(fail={stage: exc})
    store = ResultStore(tmp_path)

    async def body() -> SessionResult:
        async with StagedPipeline(driver, config(), store=store) as pipeline:
            result = await pipeline.run(SessionJob("x"))
            assert (await pipeline.run(SessionJob("y"))).status == "error"  # the pools survived the crash
            return result

    result = run(body())
    assert result.status == "error"
    assert result.error == message
    assert len(result.trajectory.traces) == traces and result.reward == reward
    assert result.num_completions == completions
    assert store.read("x").error == message
    assert ("x", stage in ("init",)) in driver.teardowns  # immediate after a failed init, graceful otherwise
    assert driver.live == set()


def test_a_failing_teardown_is_retried_immediately_and_reported() -> None:
    driver = SimDriver(fail={"teardown": RuntimeFailure("container would not die")})

    async def body() -> SessionResult:
        async with StagedPipeline(driver, config()) as pipeline:
            return await pipeline.run(SessionJob("td"))

    result = run(body())
    assert result.status == "completed" and result.reward == 1.0
    assert result.error == "teardown failed: container would not die"
    assert driver.teardowns == [("td", False), ("td", True)]


# ---- durability and notification order ----------------------------------------------------------------------------


class OrderedStore(ResultStore):
    """A real ResultStore that also records when each write finished."""

    def __init__(self, root: Path, events: list[str]) -> None:
        super().__init__(root)
        self.events = events

    def write(self, result: SessionResult) -> Path:
        path = super().write(result)
        self.events.append(f"written {result.session_id}")
        return path


def test_the_result_is_on_disk_before_waiters_and_callbacks_hear_of_it(tmp_path: Path) -> None:
    events: list[str] = []
    store = OrderedStore(tmp_path / "results", events)

    def callback(result: SessionResult) -> None:
        assert store.read(result.session_id) == result
        events.append(f"callback {result.session_id}")

    async def async_callback(result: SessionResult) -> None:
        assert store.exists(result.session_id)
        events.append(f"async callback {result.session_id}")

    driver = SimDriver(calls=2)
    driver.hold("evaluate", "d1")

    async def body() -> SessionResult:
        async with StagedPipeline(driver, config(), store=store, on_result=[callback, async_callback]) as pipeline:
            await pipeline.submit(SessionJob("d1", task_id="task-1", sample_index=3, metadata={"group": 1}))

            async def waiter() -> SessionResult:
                result = await pipeline.wait("d1")
                assert store.read("d1") == result
                events.append("waiter d1")
                return result

            waiting = asyncio.create_task(waiter())
            await until(lambda: driver.entered[("evaluate", "d1")].is_set())
            assert not store.exists("d1") and events == []
            driver.gates[("evaluate", "d1")].set()
            return await waiting

    result = run(body())
    assert events[0] == "written d1"
    assert set(events[1:]) == {"waiter d1", "callback d1", "async callback d1"}
    assert (result.task_id, result.sample_index, result.metadata["group"]) == ("task-1", 3, 1)
    assert result.num_completions == 2 and result.reward == 1.0
    on_disk = (tmp_path / "results" / "d1.json").read_text()
    assert SessionResult.model_validate_json(on_disk) == result
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["d1.json"]  # no temp file left


def test_results_outlive_the_in_memory_window(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)

    async def body() -> None:
        async with StagedPipeline(SimDriver(), config(keep_finished=1), store=store) as pipeline:
            first = await pipeline.run(SessionJob("old"))
            await pipeline.run(SessionJob("new"))
            with pytest.raises(SessionError):
                pipeline.get("old")
            assert await pipeline.wait("old") == first  # read back from disk

    run(body())


# ---- metrics ------------------------------------------------------------------------------------------------------


def test_metrics_report_queue_depths_in_flight_and_capacity() -> None:
    driver = SimDriver()
    cfg = config(init_workers=1, ready_capacity=1, run_slots=1, postrun_workers=1, postrun_capacity=4)
    gates = [driver.hold("evaluate", "p"), driver.hold("run", "r"), driver.hold("init", "i")]

    async def body() -> tuple[dict[str, Any], dict[str, Any]]:
        async with StagedPipeline(driver, cfg) as pipeline:
            # p reaches POSTRUN, r RUNNING, q READY, i INIT (held), w waits for INIT
            for sid, stage in (("p", Stage.POSTRUN), ("r", Stage.RUNNING), ("q", Stage.READY), ("i", Stage.INIT)):
                job = await pipeline.submit(SessionJob(sid))
                await until(lambda job=job, stage=stage: job.stage is stage, f"{sid} in {stage}")
            await pipeline.submit(SessionJob("w"))
            busy = pipeline.metrics()
            for gate in gates:
                gate.set()
            for sid in "prqiw":
                await pipeline.wait(sid)
            return busy, pipeline.metrics()

    busy, idle = run(body())
    assert busy["stages"] == {
        "init": {"capacity": 1, "in_flight": 1, "queued": 1},
        "ready": {"capacity": 1, "queued": 1, "blocked": 0},
        "running": {"capacity": 1, "in_flight": 1},
        "postrun": {"capacity": 1, "in_flight": 1, "queued": 0, "queue_capacity": 4},
    }
    assert busy["sessions"] == {"submitted": 5, "active": 5, "finishing": 0, "finished": {}}
    assert idle["sessions"] == {"submitted": 5, "active": 0, "finishing": 0, "finished": {"completed": 5}}
    assert all(stage.get("in_flight", 0) == 0 and stage.get("queued", 0) == 0 for stage in idle["stages"].values())
    assert idle["run_slots"]["busy_seconds"] > 0 and 0 < idle["run_slots"]["utilization"] <= 1


# ---- configuration and misuse ---------------------------------------------------------------------------------------


def test_config_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown field 'run_slot' \\(did you mean 'run_slots'\\?\\)"):
        validate_model(PipelineConfig, {"run_slot": 4}, source="gateway.yaml")
    with pytest.raises(ConfigError, match="run_slots"):
        validate_model(PipelineConfig, {"run_slots": 0}, source="gateway.yaml")


def test_duplicate_sessions_and_unknown_ids_are_refused() -> None:
    async def body() -> None:
        async with StagedPipeline(SimDriver(), config()) as pipeline:
            await pipeline.run(SessionJob("dup"))
            with pytest.raises(SessionError, match="already exists"):
                await pipeline.submit(SessionJob("dup"))
            with pytest.raises(SessionError, match="unknown session"):
                await pipeline.cancel("nope")

    run(body())
    with pytest.raises(SessionError, match="not running"):
        run(StagedPipeline(SimDriver()).submit(SessionJob("early")))
