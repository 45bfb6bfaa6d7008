"""Run in the veRL venv (.ci/setup_verl.sh) by tests/trainers/test_verl_loop.py: veRL's own agent-loop worker, built
from veRL's own trainer config, generates one batch through Polar's agent loop, found in veRL's registry by name.

Arguments: the vLLM server's address (``host:port``), the model directory, the Polar task (JSON), a step number for
the weight sync between the two batches. ``$POLAR_SERVER``/``$POLAR_TOKEN`` name the Polar server. Prints one JSON
line: each batch's rows (veRL's ``AgentLoopOutput`` fields, validated by veRL's own model) and the DataProto's keys.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import verl
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, _agent_loop_registry
from verl.protocol import DataProto
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.router import get_router_handle

from polar_cli.trainers.verl_loop import AGENT_NAME, PolarAgentLoop, PolarCheckpointEngineManager

SAMPLES = 2
PROMPTS = 2


def trainer_config(model_dir: str, loop_config: Path) -> Any:
    """veRL's own PPO trainer config (its generated default), with what a Polar user changes."""
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    config.actor_rollout_ref.model.path = model_dir
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.n = SAMPLES
    rollout.prompt_length = 256
    rollout.response_length = 512
    rollout.agent.default_agent_loop = AGENT_NAME
    rollout.agent.agent_loop_config_path = str(loop_config)
    return config


def batch(task: dict[str, Any], step: int) -> DataProto:
    """What veRL's trainer hands the worker: rows repeated ``n`` times (interleaved) under one ``uid`` per prompt."""
    rows = [{"uid": f"step{step}-prompt{p}", "raw_prompt": [{"role": "user", "content": task["instruction"]}],
             "polar_task": json.dumps({**task, "instruction": f"{task['instruction']} ({p})"})}
            for p in range(PROMPTS) for _ in range(SAMPLES)]  # fmt: skip
    non_tensor = {key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]}
    return DataProto.from_dict(non_tensors=non_tensor, meta_info={"global_steps": step})


def rows(output: DataProto) -> list[dict[str, Any]]:
    """The batch's rows back as AgentLoopOutput fields (unpadded), validated by veRL's own model."""
    found = []
    for i in range(len(output)):
        mask = output.batch["attention_mask"][i].tolist()
        prompt_len = output.batch["prompts"].shape[1]
        prompt = [t for t, m in zip(output.batch["prompts"][i].tolist(), mask[:prompt_len], strict=True) if m]
        kept = mask[prompt_len:]
        response = [t for t, m in zip(output.batch["responses"][i].tolist(), kept, strict=True) if m]
        extra = output.non_tensor_batch
        scores = output.batch["rm_scores"] if "rm_scores" in list(output.batch.keys()) else None
        native = AgentLoopOutput(
            prompt_ids=prompt, response_ids=response,
            response_mask=output.batch["response_mask"][i].tolist()[: len(response)],
            response_logprobs=output.batch["rollout_log_probs"][i].tolist()[: len(response)],
            reward_score=None if scores is None else float(scores[i].sum()),
            num_turns=int(extra["__num_turns__"][i]), metrics={}, extra_fields={"polar": extra["polar"][i]},
        )  # fmt: skip
        found.append({**native.model_dump(), "uid": str(extra["uid"][i])})
    return found


def main() -> None:
    address, model_dir, task_json, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    task = json.loads(task_json)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        loop_config = Path(tmp) / "agent_loops.yaml"
        loop_config.write_text(f"- name: {AGENT_NAME}\n  _target_: polar_cli.trainers.verl_loop.PolarAgentLoop\n")
        config = trainer_config(model_dir, loop_config)
        # veRL's server-manager objects: its load balancer, holding the vLLM server as its one replica (veRL's
        # handle to its server actor is not needed: Polar's harnesses talk to the server over HTTP), and its client.
        balancer = get_router_handle(servers={address: None})
        worker = AgentLoopWorker(config, LLMServerClient(config, balancer))
        registered = _agent_loop_registry[AGENT_NAME]["_target_"]
        first = asyncio.run(worker.generate_sequences(batch(task, 0)))
        # veRL's weight sync, as its trainer calls it ("naive" backend: the trainer's actor worker group pushes the
        # weights; here one with none to push), Polar told around it. Nothing is launched (no GPU): the manager gets
        # the fields update_weights reads, and the replica is a stand-in with what the manager reads of veRL's
        # vLLMReplica, its server_address (veRL's vLLM replica module needs vLLM, which this venv has not).
        replica = SimpleNamespace(server_address=address)
        manager = PolarCheckpointEngineManager.__new__(PolarCheckpointEngineManager)
        manager.backend, manager.replicas, manager.actor_wg = "naive", [replica], _NoWorkers()
        manager.update_weights(step)
        second = asyncio.run(worker.generate_sequences(batch(task, 1)))
    print(json.dumps({"registered": registered, "loop": f"{PolarAgentLoop.__module__}.{PolarAgentLoop.__name__}",
                      "keys": sorted(first.batch.keys()), "first": rows(first), "second": rows(second)}))  # fmt: skip


class _NoWorkers:
    """The trainer's actor worker group, with no worker to sync (the "naive" backend asks it to push the weights)."""

    def update_weights(self, global_steps: int | None = None, mode: str | None = None) -> list[Any]:
        return []


if __name__ == "__main__":
    main()
