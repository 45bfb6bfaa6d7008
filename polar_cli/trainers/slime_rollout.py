"""Slime's rollout function on Polar (docs/trainers.md, "slime"): ``--rollout-function-path
polar_cli.trainers.slime_rollout.generate_rollout`` and ``--eval-function-path
polar_cli.trainers.slime_rollout.eval_rollout``.

Matched against THUDM/slime 0.3.1, commit ``624b824a898ab0ec1fcb4d373004c7f3852bf515`` (2026-08-21): the call
``fn(args, rollout_id, data_source, evaluation=False)`` (``slime/rollout/base_types.py`` ``call_rollout_fn``), its
``RolloutFnTrainOutput(samples, metrics)`` / ``RolloutFnEvalOutput(data, metrics)``, ``slime.utils.types.Sample``
and the data source's buffer (``RolloutDataSourceWithBuffer.get_samples`` / ``add_samples`` / ``get_buffer_length``,
``slime/rollout/data_source.py``). Slime is imported when the function is called, in slime's rollout process.

One training call (rollout ``rollout_id``):

1. Each group the data source hands out (``n_samples_per_prompt`` copies of one row) becomes one Polar task with
   ``num_samples = n_samples_per_prompt`` (:func:`row_task`), submitted to the Polar rollout server through
   ``PolarClient.groups`` with ``batch_size = rollout_batch_size``. As slime's own rollout does, a call pulls
   ``over_sampling_batch_size`` groups at a time until it can fill the batch, submits them all, and pulls again only
   when dropped groups leave the batch short.
2. Each usable group comes back as ``n_samples_per_prompt`` slime ``Sample``s (tokens = prompt + response ids,
   ``loss_mask``, ``rollout_log_probs`` as recorded, reward, status, weight versions). A session the group dropped
   (it did not complete, captured nothing trainable, or has no reward) keeps its place as a ``remove_sample=True``
   sample (no loss; its reward the mean of the usable ones, so it does not move the group's baseline), because slime
   reshapes rewards by ``n_samples_per_prompt``. A session with several trainable traces under ``polar_traces:
   each`` is a list of samples sharing its ``rollout_id`` (slime's fan-out).
3. Once the batch is full, as slime's partial-rollout buffer expects: groups that ended after it was full
   (over-sampling) go back to the data source (``add_samples``) instead of being thrown away; with
   ``--partial-rollout`` the tasks still running keep running on Polar and their groups go back too (status
   ``ABORTED``, ``metadata["start_rollout_id"]``), else they are cancelled and dropped, as slime drops them. A group
   that comes back from the buffer carries its Polar task id (``metadata["polar_task_id"]``): the next call joins
   that task instead of submitting the row again, and judges it under its own ``max_staleness``.
4. Weight sync: slime updates its inference engines itself between two calls. With ``polar_weight_sync: bump`` (the
   default) a training call ends by pausing Polar's sampling (``polar_pause_mode``) and the next call (training or
   evaluation) starts by resuming it one policy version on: no weights are reloaded, and every completion records
   the version it was sampled under. ``polar_register_engines`` registers slime's SGLang workers (the router's
   ``/workers``) as the pool's replicas once, so the harnesses sample from the weights slime trains.

Polar's settings are slime args (``--custom-config-path polar.yaml`` sets them; see :class:`SlimePolarConfig`), the
server URL and token also ``$POLAR_SERVER`` / ``$POLAR_TOKEN``.
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field

from polar_cli.client import PolarClient, as_task, resolve_server
from polar_cli.config import read_data_file
from polar_cli.errors import ConfigError, PolarError
from polar_cli.extras import require
from polar_cli.groups import CarriedTask, Group, GroupConfig, GroupStats, ReuseBuffer
from polar_cli.models import SessionResult, StrictModel, TaskRequest
from polar_cli.models.base import validate_model
from polar_cli.models.inference import PauseMode
from polar_cli.trainers.rules import SampleStatus, TraceRule, TraceSample, sample_status, session_samples
from polar_cli.trainers.slime import SlimeSample, _slime

SLIME_VERSION = "0.3.1"
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
TASK_ID_KEY = "polar_task_id"
"""Where a group returned to slime's data source keeps its Polar task (``Sample.metadata``)."""
TASK_ENV = "POLAR_SLIME_TASK"


class SlimePolarConfig(StrictModel):
    """Polar's settings for the slime rollout function, read from slime's ``args`` as ``polar_<name>`` (put them in
    the YAML file of slime's ``--custom-config-path``)."""

    url: str | None = Field(default=None, description="the Polar rollout server (polar serve); else $POLAR_SERVER")
    token: str | None = Field(default=None, description="its token; else $POLAR_TOKEN")
    task: dict[str, Any] = Field(
        description="the task template every row becomes (a Polar task: agent, runtime, evaluator, ...), inline or "
        f"a YAML/JSON file path (also ${TASK_ENV}). Its instruction is the row's prompt, or the template's with "
        "'{prompt}' replaced by it; a row's metadata['polar_task'] is merged over it"
    )
    traces: TraceRule = Field(default="last_main", description="which trainable traces of a session are samples")
    min_usable_fraction: float = Field(default=0.6, gt=0, le=1, description="GroupConfig.min_usable_fraction")
    max_staleness: int | None = Field(default=None, ge=0, description="GroupConfig.max_staleness")
    dynamic_sampling: bool = Field(default=False, description="drop groups whose rewards are all equal (DAPO)")
    weight_sync: Literal["bump", "off"] = Field(
        default="bump",
        description="bump: pause Polar after each training call (slime syncs its weights then) and resume one "
        "version on at the next call; off: the trainer tells Polar itself",
    )
    pause_mode: PauseMode = Field(default="wait", description="how calls in flight are paused around the sync")
    register_engines: bool = Field(
        default=False, description="register slime's SGLang workers (its router's /workers) as the pool's replicas"
    )
    timeout_s: float = Field(default=60.0, gt=0, description="each request to the Polar server")

    @classmethod
    def from_args(cls, args: Any) -> SlimePolarConfig:
        """The ``polar_*`` attributes of slime's ``args`` (a task given as a path is read)."""
        data = {name: getattr(args, f"polar_{name}") for name in cls.model_fields if hasattr(args, f"polar_{name}")}
        task = data.get("task")
        if task is None:
            task = os.environ.get(TASK_ENV)
            if not task:
                raise ConfigError(f"slime rollout: no Polar task template: set polar_task in slime's "
                                  f"--custom-config-path YAML (a task, or a task file) or ${TASK_ENV}")  # fmt: skip
        if isinstance(task, str | Path):
            loaded = read_data_file(task)
            if not isinstance(loaded, dict):
                raise ConfigError(f"slime rollout: the task file {task} holds no mapping")
            task = loaded
        data["task"] = task
        return validate_model(cls, data, source="slime's polar_* args")


def prompt_text(prompt: str | Sequence[dict[str, Any]]) -> str:
    """A row's prompt as an instruction: the string, or the last user message's text of a chat prompt."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt)):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise ConfigError("slime rollout: a row's prompt has no user message to make the task's instruction")


def row_task(config: SlimePolarConfig, row: Any, *, num_samples: int, rollout_id: int) -> TaskRequest:
    """The Polar task of one data-source group (``row``: its first ``Sample``): the template, the row's
    ``metadata['polar_task']`` merged over it, instruction from the prompt, ``num_samples``, a fresh task id, and
    metadata ``group_id`` (the row's ``group_index``), ``rollout_step``, the row's label and other metadata."""
    row_metadata = dict(row.metadata or {})
    task = copy.deepcopy(config.task) | dict(row_metadata.pop("polar_task", None) or {})
    row_metadata.pop(TASK_ID_KEY, None)
    template = task.get("instruction")
    text = prompt_text(row.prompt)
    instruction = template.replace("{prompt}", text) if isinstance(template, str) and template else text
    metadata = {**dict(task.get("metadata") or {}), **row_metadata, "group_id": row.group_index,
                "rollout_step": rollout_id, "label": row.label}  # fmt: skip
    task_id = f"slime-{rollout_id}-{row.group_index}-{uuid.uuid4().hex[:8]}"
    return as_task({**task, "task_id": task_id, "instruction": instruction, "num_samples": num_samples,
                    "metadata": metadata})  # fmt: skip


def _slime_types() -> Any:
    return require("slime.utils.types", needed_by="polar_cli.trainers.slime_rollout", distribution="slime",
                   extra="", also=" (slime is not on PyPI: install it from github.com/THUDM/slime)")  # fmt: skip


def _base_types() -> Any:
    return require("slime.rollout.base_types", needed_by="polar_cli.trainers.slime_rollout", distribution="slime",
                   extra="", also=" (slime is not on PyPI: install it from github.com/THUDM/slime)")  # fmt: skip


def _native(row: Any, sample: SlimeSample, *, rollout_id: int | None) -> Any:
    """``row`` (a data-source Sample) copied and filled with ``sample``: the row keeps its index, label and
    metadata."""
    status = _slime_types().Sample.Status
    out = copy.deepcopy(row)
    for name, value in sample.to_kwargs().items():
        if name in ("group_index", "index", "label"):
            continue
        if name == "metadata":
            value = {**dict(row.metadata or {}), **value}
        setattr(out, name, value)
    out.status = status[sample.status]
    out.rollout_id = rollout_id
    return out


def _removed(row: Any, result: SessionResult | None, reward: float | None, cause: str) -> Any:
    """A session the group dropped, as a ``remove_sample`` sample in its place: its first trace when it has one,
    else the row with no response."""
    traces = result.trajectory.traces if result is not None else []
    status: SampleStatus = (sample_status(result.status, None) if result is not None else None) or "ABORTED"
    if traces:
        trace = traces[-1]
        mask = [0] * len(trace.response_ids)
        each = TraceSample(trace=trace, status=status, session_status=result.status if result else "cancelled",
                           loss_mask=mask, logprobs=[0.0] * len(mask), reward=reward,
                           session_id=result.session_id if result else None, task_id=result.task_id if result else None,
                           sample_index=result.sample_index if result else 0, trace_index=len(traces) - 1)  # fmt: skip
        out = _native(row, _slime(each, group_index=row.group_index, index=row.index), rollout_id=row.index)
    else:
        out = copy.deepcopy(row)
        out.response, out.response_length, out.loss_mask, out.rollout_log_probs = "", 0, [], []
        out.status = _slime_types().Sample.Status[status]
        out.rollout_id = row.index
    out.reward = reward
    out.remove_sample = True
    out.metadata = {**dict(out.metadata or {}), "polar_dropped": cause}
    return out


def group_samples(group: Group, rows: Sequence[Any], traces: TraceRule = "last_main") -> list[Any]:
    """A usable Polar group as slime's group: one entry per row (sample_index i ↔ ``rows[i]``), a ``Sample``, or a
    list of them when a session has several samples under ``traces``; a dropped session is a ``remove_sample``
    sample."""
    usable = {r.sample_index: r for r in group.results}
    dropped = {d.sample_index: d for d in group.dropped}
    mean = sum(group.rewards) / len(group.rewards) if group.rewards else None
    out: list[Any] = []
    for index, row in enumerate(rows):
        result = usable.get(index)
        each = session_samples(result, traces) if result is not None else []
        if not each:
            drop = dropped.get(index)
            cause = drop.cause if drop is not None else "no sample"
            out.append(_removed(row, drop.result if drop else result, mean, cause))
            continue
        natives = [_native(row, _slime(s, group_index=row.group_index, index=row.index), rollout_id=row.index)
                   for s in each]  # fmt: skip
        out.append(natives[0] if len(natives) == 1 else natives)
    return out


def _first(entry: Any) -> Any:
    return entry[0] if isinstance(entry, list) else entry


class SlimeRollout:
    """The state the rollout function keeps across slime's calls in its rollout process: the client, whether Polar
    was paused for a weight sync, whether the engines are registered."""

    def __init__(self, config: SlimePolarConfig) -> None:
        self.config = config
        url, token = resolve_server(config.url, config.token)
        self.client = PolarClient(url, token, timeout=config.timeout_s)
        self.paused = False
        self.registered = False

    def _start_call(self, args: Any) -> None:
        if self.config.register_engines and not self.registered:
            self.register_engines(args)
        if self.paused:
            self.client.resume()  # slime synced its weights since the last training call: one version on
            self.paused = False

    def register_engines(self, args: Any) -> list[str]:
        """slime's SGLang workers (its router's ``/workers``) added to the pool, those not in it yet."""
        router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/workers"
        try:
            workers = httpx.get(router, timeout=self.config.timeout_s).raise_for_status().json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise PolarError(f"slime rollout: cannot list slime's SGLang workers at {router}: {exc}") from exc
        pools = [gateway.pool for gateway in self.client.inference().gateways if gateway.pool is not None]
        listed = {replica.url for pool in pools for replica in pool.replicas}
        added = [worker["url"] for worker in workers if worker["url"] not in listed]
        for url in added:
            self.client.add_backend(url)
        self.registered = True
        return added

    def _round(self, data_source: Any, need: int, args: Any, rollout_id: int,
               rows: dict[str, list[Any]]) -> tuple[list[TaskRequest], ReuseBuffer]:  # fmt: skip
        """The groups of one round, pulled as slime's rollout pulls them: ``over_sampling_batch_size`` at a time until
        at least ``need``. A group that carries a Polar task (it came back from slime's buffer) rejoins that task, in
        the reuse buffer; the others become new tasks."""
        n = int(args.n_samples_per_prompt)
        over = int(getattr(args, "over_sampling_batch_size", None) or args.rollout_batch_size)
        tasks: list[TaskRequest] = []
        reuse = ReuseBuffer()
        while len(tasks) + len(reuse) < need:
            pulled = data_source.get_samples(over)
            if not pulled:
                raise ConfigError(f"slime rollout: the data source gave no groups for rollout {rollout_id}")
            for group in pulled:
                if len(group) != n:
                    raise ConfigError(f"slime rollout: the data source gave a group of {len(group)} samples; "
                                      f"n_samples_per_prompt is {n}")  # fmt: skip
                task_id = (group[0].metadata or {}).get(TASK_ID_KEY)
                try:
                    carried = self.client.task_request(task_id) if task_id else None
                except PolarError:
                    carried = None  # the server no longer has it: the row runs again
                if carried is not None:
                    reuse.running.append(CarriedTask(task=carried, status=None, kept_running=True))
                    rows[carried.task_id] = group
                    continue
                task = row_task(self.config, group[0], num_samples=n, rollout_id=rollout_id)
                rows[task.task_id] = group
                tasks.append(task)
        return tasks, reuse

    def train(self, args: Any, rollout_id: int, data_source: Any) -> Any:
        """One training rollout: ``rollout_batch_size`` groups as ``RolloutFnTrainOutput``. As slime's rollout does,
        a round submits whole ``over_sampling_batch_size`` pulls until the batch can be filled, and a new round
        starts only when the groups dropped (too few usable sessions, stale, all rewards equal) leave it short."""
        self._start_call(args)
        batch = int(args.rollout_batch_size)
        partial = bool(getattr(args, "partial_rollout", False))
        rows: dict[str, list[Any]] = {}
        data: list[list[Any]] = []
        rounds: list[GroupStats] = []
        reuse = ReuseBuffer()
        while len(data) < batch:
            tasks, reuse = self._round(data_source, batch - len(data), args, rollout_id, rows)
            config = GroupConfig(batch_size=batch - len(data), max_in_flight=len(tasks) + len(reuse),
                                 keep_running=partial, min_usable_fraction=self.config.min_usable_fraction,
                                 max_staleness=self.config.max_staleness,
                                 dynamic_sampling=self.config.dynamic_sampling)  # fmt: skip
            rounds.append(GroupStats())
            for group in self.client.groups(tasks, config, stats=rounds[-1], reuse=reuse):
                data.append(group_samples(group, rows[group.task_id], self.config.traces))
        back = self._give_back(reuse, rows, rollout_id)  # the last round's surplus: the others ran out
        if back:
            data_source.add_samples(back)
        if self.config.weight_sync == "bump":
            self.client.pause(self.config.pause_mode)  # slime syncs its weights now; the next call resumes
            self.paused = True
        data.sort(key=lambda group: _first(group[0]).index)
        return _base_types().RolloutFnTrainOutput(samples=data, metrics=_metrics(rounds, len(back)))

    def _give_back(self, reuse: ReuseBuffer, rows: dict[str, list[Any]], rollout_id: int) -> list[list[Any]]:
        """What the call leaves in ``reuse`` (ended after the batch was full; running, with partial rollout) as
        groups for slime's buffer: the rows, each carrying its task id; the running ones ``ABORTED``."""
        status = _slime_types().Sample.Status
        back = []
        for carried, running in [(c, False) for c in reuse.ended] + [(c, True) for c in reuse.running]:
            group = [copy.deepcopy(row) for row in rows[carried.task.task_id]]
            for row in group:
                row.metadata = {**dict(row.metadata or {}), TASK_ID_KEY: carried.task.task_id}
                row.metadata.setdefault("start_rollout_id", rollout_id)
                row.status = status.ABORTED if running else status.PENDING
            back.append(group)
        reuse.ended, reuse.running = [], []
        return back

    def evaluate(self, args: Any, rollout_id: int) -> Any:
        """Every row of each of slime's eval datasets (``args.eval_datasets``: a JSONL file, its prompt under
        ``input_key``) as one Polar task of ``n_samples_per_eval_prompt`` sessions; every session is a sample.
        Sessions without a reward are left out of ``rewards`` and counted in the metrics."""
        self._start_call(args)
        types = _slime_types()
        data: dict[str, dict[str, Any]] = {}
        metrics: dict[str, Any] = {}
        for dataset in getattr(args, "eval_datasets", None) or []:
            key = dataset.input_key or args.input_key
            label_key = dataset.label_key or getattr(args, "label_key", None)
            n = int(dataset.n_samples_per_eval_prompt or getattr(args, "n_samples_per_eval_prompt", 1) or 1)
            lines = Path(dataset.path).read_text().splitlines()
            tasks = []
            for index, line in enumerate(filter(None, map(str.strip, lines))):
                record = json.loads(line)
                row = types.Sample(group_index=index, index=index, prompt=record[key],
                                   label=record.get(label_key) if label_key else None)  # fmt: skip
                task = row_task(self.config, row, num_samples=n, rollout_id=rollout_id)
                self.client.submit(task)
                tasks.append((task, row))
            samples: list[Any] = []
            missing = 0
            for task, row in tasks:
                for result in self.client.wait(task.task_id).results:
                    each = session_samples(result, self.config.traces) if result.reward is not None else []
                    if not each:
                        missing += 1
                        continue
                    samples.append(_native(row, _slime(each[-1], group_index=row.group_index, index=row.index),
                                           rollout_id=row.index))  # fmt: skip
            data[dataset.name] = {"rewards": [s.reward for s in samples],
                                  "truncated": [s.status == types.Sample.Status.TRUNCATED for s in samples],
                                  "samples": samples}  # fmt: skip
            metrics[f"polar/eval/{dataset.name}/no_reward"] = missing
        return _base_types().RolloutFnEvalOutput(data=data, metrics=metrics)


def _metrics(rounds: Sequence[GroupStats], returned: int) -> dict[str, Any]:
    """A training call's Polar statistics, for slime's rollout metrics."""
    metrics = {"polar/rounds": len(rounds), "polar/returned_groups": returned}
    for name in ("submitted", "dropped", "cancelled", "reused", "carried_in"):
        metrics[f"polar/{name}"] = sum(len(getattr(stats, name)) for stats in rounds)
    for stats in rounds:
        for reason, count in stats.dropped_by_reason().items():
            metrics[f"polar/dropped_{reason}"] = metrics.get(f"polar/dropped_{reason}", 0) + count
    return metrics


_ROLLOUTS: dict[str, SlimeRollout] = {}


def rollout_for(args: Any) -> SlimeRollout:
    """The rollout state for ``args``' Polar settings (one per settings, kept for the process)."""
    config = SlimePolarConfig.from_args(args)
    key = config.model_dump_json()
    if key not in _ROLLOUTS:
        _ROLLOUTS[key] = SlimeRollout(config)
    return _ROLLOUTS[key]


def close_rollouts() -> None:
    """Close the clients the rollout function keeps (slime's process simply exits; tests call this)."""
    for rollout in _ROLLOUTS.values():
        rollout.client.close()
    _ROLLOUTS.clear()


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's ``--rollout-function-path``: a training rollout (``RolloutFnTrainOutput``), or with ``evaluation``
    the evaluation one (``RolloutFnEvalOutput``)."""
    rollout = rollout_for(args)
    if evaluation:
        return rollout.evaluate(args, rollout_id)
    return rollout.train(args, rollout_id, data_source)


def eval_rollout(args: Any, rollout_id: int, data_source: Any = None, evaluation: bool = True) -> Any:
    """slime's ``--eval-function-path``: the evaluation rollout (``RolloutFnEvalOutput``)."""
    return rollout_for(args).evaluate(args, rollout_id)
