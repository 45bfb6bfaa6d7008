"""The generation loop: a dataset's tasks, ``samples`` sessions each, on a rollout service (embedded or remote), at
most ``concurrency`` in flight, each failed or empty session retried up to ``max_retries`` times, every final result
in the folder's ledger (``polar_cli.generate.ledger``).

Each (task, sample, attempt) is its own one-sample service task, ``<task_id>.s<sample>.a<attempt>``, recorded in the
ledger before it is submitted. A re-run submits the same body under the same id (the service answers it
idempotently, and its own database, under ``<out>/service`` when embedded, still has the session), so after a crash
it picks up sessions where they are: finished ones are not run again, and no (task, sample) gets two final results.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from polar_cli.aio import cancel_and_wait
from polar_cli.client import AsyncPolarClient
from polar_cli.config import set_dotted
from polar_cli.errors import ConfigError, PolarError
from polar_cli.gateway.config import GatewayConfig, PipelineConfig
from polar_cli.generate.ledger import LEDGER, Ledger, ResultRow, summarize
from polar_cli.launch import ServeConfig, ServeInfo, serve
from polar_cli.models import SessionResult, StrictModel, TaskRequest, Trajectory, validate_model
from polar_cli.models.limits import MAX_NUM_SAMPLES, MAX_TIMEOUT_S
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.proxy import ProxyConfig
from polar_cli.registry import get_dataset
from polar_cli.rewards import DEFAULT_MIN_REWARD
from polar_cli.server.config import ServerConfig
from polar_cli.server.retention import RetentionConfig

log = logging.getLogger(__name__)
SERVICE_DIR = "service"
RETRYABLE = "error"


class GenerateOptions(StrictModel):
    """What ``polar generate`` runs (everything but where: see ``generate``)."""

    dataset: str
    dataset_options: dict[str, Any] = Field(default_factory=dict)
    harness: str | None = Field(default=None, description="overrides agent.harness")
    model: str | None = Field(default=None, description="overrides agent.model_name")
    samples: PositiveInt | None = Field(default=None, le=MAX_NUM_SAMPLES, description="overrides num_samples")
    timeout_seconds: PositiveFloat | None = Field(default=None, le=MAX_TIMEOUT_S, description="overrides the timeout")
    builder: str | None = Field(default=None, description="overrides builder.strategy")
    limit: PositiveInt | None = Field(default=None, description="the first N tasks only")
    concurrency: PositiveInt = Field(default=8, description="sessions in flight at once")
    max_retries: NonNegativeInt = Field(default=1, description="re-runs of a session that errs or yields no tokens")
    group_by: str = Field(default="repo", description="task metadata field (or task_id) the tables group by")
    accept_min_reward: float = Field(
        default=DEFAULT_MIN_REWARD, description="a completed session with this reward is accepted"
    )

    def recipe(self) -> dict[str, Any]:
        """What every row of a folder depends on, so it must not change between a run and its resumption. Samples,
        the limit and the dataset options may: a task already recorded must come back the same (``check_tasks``), and
        more samples or more tasks extend the folder."""
        fixed = {"dataset", "harness", "model", "timeout_seconds", "builder", "accept_min_reward"}
        return self.model_dump(mode="json", include=fixed)

    def overrides(self) -> dict[str, Any]:
        return {"agent.harness": self.harness, "agent.model_name": self.model, "num_samples": self.samples,
                "timeout_seconds": self.timeout_seconds, "builder.strategy": self.builder}  # fmt: skip


@dataclass
class GenerateProgress:
    """Counts so far (this run and earlier ones): sessions = tasks x samples."""

    total: int = 0
    done: int = 0
    accepted: int = 0
    failed: int = 0
    retries: int = 0
    resumed: int = 0
    """Sessions already finished by an earlier run of the same command."""
    in_flight: int = 0


def group_of(task: TaskRequest, group_by: str) -> str:
    value = task.task_id if group_by == "task_id" else task.metadata.get(group_by)
    return "-" if value is None else str(value)


def load_tasks(options: GenerateOptions) -> Iterator[TaskRequest]:
    """The dataset's tasks with the command-line overrides applied (its options are validated first)."""
    dataset = get_dataset(options.dataset)
    dataset.check_config(options.dataset_options)
    tasks = dataset.tasks(**options.dataset_options)
    for task in itertools.islice(tasks, options.limit):
        data = set_dotted(task.model_dump(mode="json"), options.overrides(), source="polar generate")
        yield validate_model(TaskRequest, data, source=f"task {task.task_id}")


def check_tasks(ledger: Ledger, tasks: list[TaskRequest]) -> None:
    """ConfigError when a task the folder already recorded comes back other than it was first run (its samples may
    grow), naming the task and the fields that differ: its rows would not match the new ones."""
    for task in tasks:
        stored = ledger.stored_task(task.task_id)
        if stored is None:
            continue
        before, now = stored.model_dump(mode="json"), task.model_dump(mode="json")
        changed = sorted(k for k in before.keys() | now.keys() if k != "num_samples" and before.get(k) != now.get(k))
        if changed:
            raise ConfigError(
                f"{ledger.path.parent}: task {task.task_id} is not the one this folder first ran ({', '.join(changed)} "
                "differ), so its rows would not match: re-run with the dataset options it was generated with, or use "
                "another --out"
            )


def embedded_serve_config(
    out: Path, proxy: ProxyConfig, pipeline: PipelineConfig | None = None, retention: RetentionConfig | None = None
) -> ServeConfig:
    """``polar serve``'s one-process topology on loopback, its data under ``<out>/service`` (``retention``: what of
    it may go once the ledger holds it; default: nothing)."""
    data_dir = out / SERVICE_DIR
    return ServeConfig(
        role="all",
        server=ServerConfig(
            port=0, data_dir=data_dir, heartbeat_interval_s=1.0, retention=retention or RetentionConfig()
        ),
        gateway=GatewayConfig(
            port=0, data_dir=data_dir, proxy=proxy, pipeline=pipeline or PipelineConfig(), backend_check="fail"
        ),
    )


@contextlib.asynccontextmanager
async def embedded_service(config: ServeConfig) -> AsyncIterator[ServeInfo]:
    """Run ``polar serve``'s roles in this event loop (``polar_cli.launch.serve``) until the block ends."""
    ready: asyncio.Future[ServeInfo] = asyncio.get_running_loop().create_future()
    runner = asyncio.create_task(serve(config, on_ready=ready.set_result), name="polar-generate-serve")
    try:
        waiting: list[asyncio.Future[Any]] = [ready, runner]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            runner.result()  # raises what stopped it
            raise PolarError("the embedded rollout service stopped before it was ready")
        yield ready.result()
    finally:
        await cancel_and_wait(runner)


def service_task(task: TaskRequest, sample: int, attempt: int) -> TaskRequest:
    """The one-sample service task that runs (task, sample) for the ``attempt``-th time."""
    metadata = {**task.metadata, "polar_generate": {"task_id": task.task_id, "sample_index": sample,
                                                     "attempt": attempt}}  # fmt: skip
    script = metadata.get(SCRIPT_KEY)
    if isinstance(script, dict) and "variants" in script:  # its session is sample 0 of its own task: say which
        metadata[SCRIPT_KEY] = {**script, "sample_index": sample}
    return task.model_copy(update={"task_id": f"{task.task_id}.s{sample}.a{attempt}", "num_samples": 1,
                                   "metadata": metadata})  # fmt: skip


def _lost(task: TaskRequest, why: str) -> SessionResult:
    return SessionResult(session_id=f"{task.task_id}-lost", task_id=task.task_id, status="error",
                         trajectory=Trajectory(status="error", error=why), error=why)  # fmt: skip


class _Run:
    def __init__(self, options: GenerateOptions, ledger: Ledger, client: AsyncPolarClient,
                 on_progress: Callable[[GenerateProgress], None] | None) -> None:  # fmt: skip
        self.options, self.ledger, self.client = options, ledger, client
        self.on_progress = on_progress
        self.progress = GenerateProgress()

    def tick(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    async def one(self, task: TaskRequest, sample: int, group: str) -> None:
        """Run (task, sample) to its final result, retrying errors and empty generations."""
        attempts = self.ledger.attempts(task.task_id, sample)
        attempt = 1
        if attempts:  # resume: the unfinished last attempt again (idempotent), else the one after it
            last = attempts[-1]
            attempt = last.attempt if last.status is None else last.attempt + 1
        while True:
            body = service_task(task, sample, attempt)
            self.ledger.start_attempt(task.task_id, sample, attempt, body.task_id)
            self.progress.in_flight += 1
            self.tick()
            try:
                await self.client.submit(body)
                status = await self.client.wait(body.task_id)
            finally:
                self.progress.in_flight -= 1
            result = status.results[0] if status.results else _lost(task, f"service task ended {status.state}")
            row = summarize(task, sample, group, attempt, result, self.options.accept_min_reward)
            empty = row.trainable_tokens == 0
            if (result.status == RETRYABLE or empty) and attempt <= self.options.max_retries:
                why = result.error or ("no trainable tokens" if empty else result.status)
                self.ledger.end_attempt(task.task_id, sample, attempt, result.status, why)
                await self.acknowledge(body.task_id)
                self.progress.retries += 1
                attempt += 1
                continue
            if self.ledger.finish(row, result):
                self.progress.done += 1
                self.progress.accepted += row.accepted
                self.progress.failed += result.status != "completed"
            await self.acknowledge(body.task_id)
            self.tick()
            return

    async def acknowledge(self, service_task_id: str) -> None:
        """The ledger holds the service task's outcome (committed just before): the service's retention may drop its
        copy. A service that cannot take the acknowledgement keeps everything, which is never wrong."""
        try:
            await self.client.ack(service_task_id)
        except PolarError as exc:
            log.warning("could not acknowledge service task %s: %s", service_task_id, exc)

    async def run(self, work: list[tuple[TaskRequest, int, str]]) -> None:
        queue = iter(work)

        async def worker() -> None:
            for task, sample, group in queue:
                await self.one(task, sample, group)

        await asyncio.gather(*(worker() for _ in range(min(self.options.concurrency, len(work)) or 1)))


async def generate(
    options: GenerateOptions,
    out: Path,
    *,
    server: ServeConfig | str,
    token: str | None = None,
    on_start: Callable[[ServeInfo | None], None] | None = None,
    on_progress: Callable[[GenerateProgress], None] | None = None,
) -> list[ResultRow]:
    """Run ``options`` into ``out`` (resuming what an earlier run left there) and return every final result's
    summary in dataset order. ``server`` is a ServeConfig (an embedded service, e.g. ``embedded_serve_config``) or
    the URL of a running one (with its ``token``)."""
    tasks = list(load_tasks(options))  # dataset options and every task are validated before anything runs
    if not tasks:
        raise ConfigError(f"dataset {options.dataset!r} yielded no tasks")
    if isinstance(server, ServeConfig):
        for task in tasks:
            server.gateway.proxy.check_scripted(task.task_id, task.metadata, "the task a metadata.script (as the "
                                                "demo dataset's tasks have)")  # fmt: skip
    if (out / LEDGER).is_file():  # a run that does not fit the folder is refused before anything starts
        with Ledger(out) as ledger:
            ledger.check_recipe(options.recipe())
            check_tasks(ledger, tasks)
    async with contextlib.AsyncExitStack() as stack:
        info = None
        if isinstance(server, ServeConfig):  # it checks its backend before the ledger exists
            info = await stack.enter_async_context(embedded_service(server))
            url, token = info.url, info.token
        else:
            url = server
        ledger = stack.enter_context(Ledger(out))
        ledger.check_recipe(options.recipe())
        check_tasks(ledger, tasks)
        finished = ledger.finished()
        work: list[tuple[TaskRequest, int, str]] = []
        total = 0
        for position, task in enumerate(tasks):
            group = group_of(task, options.group_by)
            stored = ledger.remember_task(position, group, task)
            if task.num_samples > stored.num_samples:  # more samples extend the folder
                ledger.more_samples(task.task_id, task.num_samples)
            else:
                task = stored
            for sample in range(task.num_samples):
                total += 1
                if (task.task_id, sample) not in finished:
                    work.append((task, sample, group))
        if on_start is not None:
            on_start(info)
        client = await stack.enter_async_context(AsyncPolarClient(url, token))
        run_ = _Run(options, ledger, client, on_progress)
        done = ledger.rows()
        run_.progress = GenerateProgress(
            total=total, done=len(done), resumed=len(done), accepted=sum(r.accepted for r in done),
            failed=sum(r.status != "completed" for r in done), retries=ledger.ended_attempts() - len(done),
        )  # fmt: skip
        run_.tick()
        await run_.run(work)
        return ledger.rows()
