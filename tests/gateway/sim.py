"""A simulated SessionDriver for pipeline tests: stages sleep, wait on gates, or fail, as each test asks.

It stands in for the runtime, harness and proxy (the pipeline is what is under test); evaluation goes through the
real ``session_completion`` evaluator.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from polar_cli.gateway import Built, RunOutcome, SessionJob
from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult
from polar_cli.models import Completion, Trace, Trajectory
from polar_cli.registry import get_evaluator

STAGES = ("init", "run", "build", "evaluate")


def completion(session_id: str, index: int) -> Completion:
    now = time.time()
    return Completion(
        completion_id=f"{session_id}-{index}",
        session_id=session_id,
        index=index,
        provider="openai_chat",
        model="sim",
        request={"messages": [{"role": "user", "content": f"turn {index}"}]},
        request_messages=[{"role": "user", "content": f"turn {index}"}],
        response_message={"role": "assistant", "content": "ok"},
        prompt_ids=[1, 2, 3 + index],
        response_ids=[7, 8],
        response_logprobs=[-0.5, -0.25],
        started_at=now,
        finished_at=now,
    )


def trace_of(item: Completion) -> Trace:
    return Trace(
        prompt_ids=item.prompt_ids,
        response_ids=item.response_ids,
        loss_mask=[1] * len(item.response_ids),
        prompt_messages=item.request_messages,
        response_messages=[item.response_message],
    )


class SimDriver:
    """Per stage: ``sleeps[stage]`` seconds, an optional gate per (stage, session), an optional failure."""

    def __init__(
        self,
        *,
        sleeps: dict[str, float] | None = None,
        fail: dict[str, Exception] | None = None,
        calls: int = 1,
        hang_after_calls: bool = False,
        run_status: str = "completed",
    ) -> None:
        self.sleeps = {stage: 0.0 for stage in STAGES} | (sleeps or {})
        self.fail = fail or {}
        self.calls = calls
        self.hang_after_calls = hang_after_calls
        self.run_status = run_status
        self.gates: dict[tuple[str, str], asyncio.Event] = {}
        self.entered: dict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        self.captured: dict[str, list[Completion]] = defaultdict(list)
        self.teardowns: list[tuple[str, bool]] = []
        self.live: set[str] = set()  # sessions holding a simulated runtime
        self.on_run_end: Callable[[SessionJob], None] | None = None
        self.deadlines: dict[str, float | None] = {}

    def hold(self, stage: str, session_id: str) -> asyncio.Event:
        gate = self.gates[(stage, session_id)] = asyncio.Event()
        return gate

    async def _stage(self, stage: str, job: SessionJob) -> None:
        self.entered[(stage, job.session_id)].set()
        gate = self.gates.get((stage, job.session_id))
        if gate is not None:
            await gate.wait()
        if self.sleeps[stage]:
            await asyncio.sleep(self.sleeps[stage])
        if stage in self.fail:
            raise self.fail[stage]

    async def init(self, job: SessionJob) -> None:
        self.live.add(job.session_id)
        await self._stage("init", job)

    async def run(self, job: SessionJob, deadline: float | None) -> RunOutcome:
        self.deadlines[job.session_id] = deadline
        for index in range(self.calls):
            self.captured[job.session_id].append(completion(job.session_id, index))
        if self.hang_after_calls:
            await asyncio.Event().wait()  # a harness that stops answering
        await self._stage("run", job)
        if self.on_run_end is not None:
            self.on_run_end(job)
        return RunOutcome(self.run_status, stderr="sim stderr")  # type: ignore[arg-type]

    async def collect(self, job: SessionJob) -> list[Completion]:
        return list(self.captured[job.session_id])

    async def build(self, job: SessionJob, outcome: RunOutcome, completions: list[Completion]) -> Trajectory:
        await self._stage("build", job)
        return Trajectory(status=outcome.status, traces=[trace_of(c) for c in completions])

    async def evaluate(
        self, job: SessionJob, outcome: RunOutcome, built: Built, deadline: float | None
    ) -> EvaluationResult:
        await self._stage("evaluate", job)
        context = EvaluationContext(
            session_id=job.session_id,
            status=outcome.status,
            completions=built.completions,
            trajectory=built.trajectory,
            deadline=deadline,
        )
        return await get_evaluator("session_completion").evaluate(context)

    async def teardown(self, job: SessionJob, *, immediate: bool) -> None:
        self.teardowns.append((job.session_id, immediate))
        if "teardown" in self.fail:
            raise self.fail["teardown"]
        self.live.discard(job.session_id)


async def until(condition: Callable[[], Any], what: str = "condition", within: float = 20.0) -> None:
    """Wait for ``condition()`` to hold (polling); fail the test if it never does."""
    end = time.monotonic() + within
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
