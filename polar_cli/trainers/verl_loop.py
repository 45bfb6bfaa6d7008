"""veRL's agent loop over Polar rollouts (matched against veRL 0.9.1; docs/trainers.md, "veRL").

The only module of ``polar_cli`` that imports veRL (and Ray): import it where veRL runs. It holds two things a veRL
config names:

- :class:`PolarAgentLoop`, registered as ``polar`` in veRL's agent-loop registry
  (``verl.experimental.agent_loop.agent_loop.register``), or named by an ``agent_loop_config_path`` entry whose
  ``_target_`` is ``polar_cli.trainers.verl_loop.PolarAgentLoop`` (its other keys: this class's options). Each call
  (one sample of one dataset row) submits the row's Polar task under the id ``verl-<uid>`` with ``rollout.n`` samples,
  or joins it when another sample of the same prompt submitted it first (veRL repeats each row ``n`` times under one
  ``uid``; a submit is idempotent per task id and body), claims one of its samples and returns that session as an
  ``AgentLoopOutput``. The claims go through one named Ray actor, so the samples of a group split over several
  agent-loop workers still get distinct sessions. Before its first task, each process adds veRL's inference servers
  (its load balancer's addresses) to the Polar pool, so the harnesses sample from the weights veRL trains.
- :class:`PolarCheckpointEngineManager`, for ``actor_rollout_ref.rollout.checkpoint_manager_class``: veRL's own
  weight sync into its servers, with Polar told: sampling paused (``wait``) before it, each server's
  ``/update_weight_version`` set to the step (vLLM; skipped where the route is missing), and Polar resumed under
  policy version ``global_steps``, with no reload, so every completion carries the version that sampled it.

The Polar server and token come from the loop's ``url``/``token`` options, else ``$POLAR_SERVER``/``$POLAR_TOKEN``
(the checkpoint manager, built by veRL's trainer, reads only the environment).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from polar_cli.client import AsyncPolarClient, as_task
from polar_cli.errors import ConfigError, SessionError
from polar_cli.extras import missing

try:
    import ray
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
    from verl.utils.ray_utils import auto_await
except ImportError as exc:  # imported where veRL is not (the rest of polar_cli never imports this module)
    raise missing("verl", needed_by="polar_cli.trainers.verl_loop", distribution="verl==0.9.1", extra="") from exc
from polar_cli.models import SessionResult
from polar_cli.trainers.rules import TraceRule
from polar_cli.trainers.verl import VerlAgentLoopOutput, verl_output

AGENT_NAME = "polar"
"""The name veRL's registry knows this loop by (``default_agent_loop``, or a row's ``agent_name``)."""
TASK_FIELD = "polar_task"
"""The dataset column holding a row's Polar task: a TaskRequest's fields, as a mapping or a JSON string."""
SLOTS_ACTOR = "polar-verl-slots"
POLL_S = 0.5

log = logging.getLogger(__name__)
_registered: set[tuple[str, str]] = set()
"""(Polar server, inference server) pairs this process has added already."""


@ray.remote
class _Slots:
    """Hands out each task's sample indexes once each, across every agent-loop worker (a named Ray actor)."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def claim(self, task_id: str, samples: int) -> int:
        index = self._next.get(task_id, 0)
        if index + 1 >= samples:
            self._next.pop(task_id, None)  # the group is fully claimed: forget it
        else:
            self._next[task_id] = index + 1
        return index


def _slots() -> Any:
    return _Slots.options(name=SLOTS_ACTOR, get_if_exists=True, num_cpus=0).remote()  # type: ignore[attr-defined]


def _server_url(address: str) -> str:
    """A veRL server address (``host:port``, veRL's load-balancer id) as a URL."""
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def _row_task(row: Mapping[str, Any], field: str) -> dict[str, Any]:
    task = row.get(field)
    if isinstance(task, str):
        task = json.loads(task)
    if not isinstance(task, Mapping):
        raise ConfigError(f"the dataset row has no Polar task: column {field!r} must hold a task's fields "
                          f"(a mapping or its JSON), got {type(task).__name__}")  # fmt: skip
    return dict(task)


@register(AGENT_NAME)
class PolarAgentLoop(AgentLoopBase):
    """One sample of a dataset row, rolled out by Polar (the module docstring). Options (an agent-loop config
    entry's keys): ``url``/``token`` of the Polar server, ``task_field`` (the row's column with the task),
    ``traces`` (which trace of a session is the sample: ``main`` or ``last_main``), ``timeout_s`` (how long to wait
    for the session; None: the task's own timeout bounds it)."""

    def __init__(
        self,
        *args: Any,
        url: str | None = None,
        token: str | None = None,
        task_field: str = TASK_FIELD,
        traces: TraceRule = "main",
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("name", None)  # the registry entry's own name, which hydra passes along
        super().__init__(*args, **kwargs)
        self.polar_url = url
        self.polar_token = token
        self.task_field = task_field
        self.traces: TraceRule = traces
        self.timeout_s = timeout_s

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        samples = int(self.rollout_config.n)
        uid = kwargs.get("uid")
        task = _row_task(kwargs, self.task_field)
        if uid is not None:
            task["task_id"] = f"verl-{uid}"
            task["num_samples"] = samples
        else:  # no group to join: a task of its own
            task.pop("task_id", None)
            task["num_samples"] = samples = 1
        request = as_task(task)
        async with AsyncPolarClient(self.polar_url, self.polar_token) as client:
            await self._register_servers(client)
            await client.submit(request)
            index = 0 if samples == 1 else await _slots().claim.remote(request.task_id, samples)
            result = await _session(client, request.task_id, index, self.timeout_s)
        return self._output(result).to_native()

    async def _register_servers(self, client: AsyncPolarClient) -> None:
        """Add veRL's inference servers (its load balancer's) to the Polar pool, once per process."""
        balancer = getattr(self.server_manager, "_load_balancer", None)
        if balancer is None:
            return
        for address in await balancer.get_all_servers.remote():
            key = (client.url, _server_url(address))
            if key not in _registered:
                await client.add_backend(key[1])
                _registered.add(key)

    def _output(self, result: SessionResult) -> VerlAgentLoopOutput:
        """The session as one output, cut to ``rollout.prompt_length`` (left) and ``response_length`` (right),
        as veRL's own loops cut theirs (its padding needs both to fit)."""
        output = verl_output(result, traces=self.traces)
        output.prompt_ids = self._cap_text_prompt_length(output.prompt_ids)
        limit = int(self.rollout_config.response_length)
        if len(output.response_ids) > limit:
            output.extra_fields["polar"]["cut_response_from"] = len(output.response_ids)
            output.response_ids = output.response_ids[:limit]
            output.response_mask = output.response_mask[:limit]
            output.response_logprobs = output.response_logprobs[:limit]
        return output


async def _session(client: AsyncPolarClient, task_id: str, index: int, timeout_s: float | None) -> SessionResult:
    async for result in client.results(task_id, timeout_s, poll_interval=POLL_S):
        if result.sample_index == index:
            return result
    status = await client.status(task_id)
    if status.state == "running":
        raise SessionError(f"sample {index} of Polar task {task_id} did not end within {timeout_s} s")
    raise SessionError(f"Polar task {task_id} ended ({status.state}) without sample {index}")


class PolarCheckpointEngineManager(CheckpointEngineManager):
    """veRL's ``CheckpointEngineManager`` with Polar told of each weight sync (the module docstring). Named by
    ``actor_rollout_ref.rollout.checkpoint_manager_class``; the Polar server is ``$POLAR_SERVER``."""

    @auto_await
    async def update_weights(self, global_steps: int | None = None) -> Any:
        async with AsyncPolarClient() as client:
            await client.pause("wait")
            try:
                metrics = await super().update_weights(global_steps)
                if global_steps is not None:
                    await _tell_servers(self.replicas, global_steps)
            except BaseException:
                log.error("veRL's weight sync failed: Polar's sampling stays paused (resume it once the servers "
                          "hold usable weights)")  # fmt: skip
                raise
            await client.resume(global_steps)
        return metrics


async def _tell_servers(replicas: list[Any], version: int) -> None:
    """``POST /update_weight_version`` on each replica's server (``RolloutReplica.server_address``, ``host:port``;
    vLLM's route; a 404: the route is missing, skipped)."""
    urls = [_server_url(address) for r in replicas if (address := getattr(r, "server_address", None))]
    async with httpx.AsyncClient(timeout=30) as http:
        answers = await asyncio.gather(
            *(http.post(f"{url}/update_weight_version", json={"new_version": str(version)}) for url in urls)
        )
    for answer in answers:
        if answer.status_code != 404:
            answer.raise_for_status()
