"""TRL's ``GRPOTrainer`` trained on Polar rollouts, on the CPU (README.md here): ``polar serve`` runs a real harness
over vLLM's CPU build, TRL's ``rollout_func`` hands the trainer Polar groups, a callback loads each new checkpoint into
vLLM in place, ``polar verify --recompute`` checks every step's traces.

    bash examples/trl_grpo/run.sh [--steps N] [--out DIR]

Matched against TRL 1.16.0 (``trl/trainer/grpo_trainer.py``): ``GRPOTrainer(rollout_func=...)`` calls
``rollout_func(prompts, trainer)`` in ``_generate`` once per generation batch, with this process's prompts, each
repeated ``num_generations`` times in a row; it wants back ``prompt_ids``, ``completion_ids``, ``logprobs`` (and
optionally ``env_mask``) per prompt, in that order; every other key reaches the reward functions.
``polar_cli.trainers.trl`` makes that dict from Polar groups.

The model is the tiny tool-calling model of ``examples/tiny_agent`` (built once from the repository and cached), the
harness the ``shell`` harness's reference agent, the tasks tiny_agent's ("Create a file FILE ... containing exactly
the line: LINE"; reward 1.0 when the file holds the line, else 0.0). One step:

1. sampling: TRL calls ``rollout_func``; each distinct prompt becomes a Polar task of ``num_generations`` sessions
   (one GRPO group), ``client.groups(...)`` waits for them, ``trl_rollout`` turns them into TRL's dict: the first
   prompt of each session's main trace, the rest of it (model turns, mask 1; tool results, mask 0) as the completion.
2. training: TRL scores the rows with ``polar_reward_func`` (each session's reward), computes its group-relative
   advantages and takes one optimizer step (its DAPO loss; a KL term only with ``--beta``) on the weights ``--train``
   names: by default only the final norm's 128 scales (README.md: the whole model's reward did not rise).
3. weight loading: a ``TrainerCallback`` saves the weights into ``DIR/checkpoints/vN`` at ``on_step_end`` and calls
   ``client.load_weights(folder)``: vLLM reloads in place, the policy version advances.
4. verify: the step's traces against the weights that sampled them (``polar verify --recompute``, in process).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import secrets
import shutil
import signal
import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "grpo_tiny"))
sys.path.insert(0, str(HERE.parent / "tiny_agent"))
import tiny_agent  # noqa: E402
from grpo import save_checkpoint, start_polar, start_vllm, verify  # noqa: E402

from polar_cli.client import PolarClient  # noqa: E402
from polar_cli.groups import Group, GroupConfig, GroupStats  # noqa: E402
from polar_cli.models import TaskRequest  # noqa: E402
from polar_cli.trainers.rules import TraceRule, select_traces  # noqa: E402
from polar_cli.trainers.trl import distinct_prompts, polar_reward_func, trl_rollout  # noqa: E402

HARNESS = "shell"  # the reference agent: one bash tool, the shortest prompt of the CLIs tiny_agent trains
TRACES: TraceRule = "last_main"  # a session whose chain still broke (token mode makes it rare): its last chain
LEARNING_RATES = {"final-norm": 1e-1, "layers": 2e-4, "all": 2e-4}  # --lr's default for each --train
RETRIES = 3  # rounds of resubmitting the prompts whose group came back with a session that is not a sample

# ---- the tasks -----------------------------------------------------------------------------------------------------

PROMPTS = {tiny_agent.instruction(file, line): (file, line) for file, line in tiny_agent.TASKS}


def task(prompt: str, task_id: str, step: int, args: argparse.Namespace) -> TaskRequest:
    """One GRPO group: tiny_agent's task for the reference agent, ``args.num_generations`` sessions, sampled at
    ``args.temperature`` (TRL's ``temperature`` is the same; vLLM records the raw logprobs, which ``polar verify``
    recomputes)."""
    file, line = PROMPTS[prompt]
    sampling = {"temperature": args.temperature, "top_p": 1.0, "top_k": -1, "max_tokens": args.max_tokens}
    spec = json.loads(tiny_agent.eval_task(HARNESS, file, line, args.max_tokens))
    # token mode: the proxy sends each prompt as ids with the earlier turns spliced in exactly as sampled, so a session
    # is one context-exact chain, which TRL trains as one completion (tool results at mask 0)
    spec["agent"] |= {"sampling": sampling, "token_mode": "tokens", "keep_reasoning": True}
    spec |= {"task_id": task_id, "num_samples": args.num_generations, "timeout_seconds": args.timeout}
    spec["metadata"] |= {"group_id": task_id, "rollout_step": step}
    return TaskRequest.model_validate(spec)


# ---- the rollout function --------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What ``rollout_func`` saw of a step, for the callback that ends it."""

    step: int
    policy_version: int
    groups: list[Group]
    results: Path
    sampling_seconds: float
    dropped: dict[str, int]
    """groups dropped (and their prompts submitted again), by reason"""
    env_masks: list[list[int]]
    """TRL's loss mask of every row"""


@dataclass
class PolarRollouts:
    """``rollout_func`` for TRL: the prompts of a generation batch as Polar tasks, their groups as TRL's dict."""

    client: PolarClient
    out: Path
    args: argparse.Namespace
    run_id: str = field(default_factory=lambda: f"trl-{secrets.token_hex(4)}")
    pending: StepRecord | None = None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        started = time.monotonic()
        step = trainer.state.global_step
        version = self.client.inference().policy_version
        wanted = distinct_prompts(prompts, self.args.num_generations)
        dropped: Counter[str] = Counter()
        groups = self.sample(wanted, step, dropped)
        step_dir = self.out / f"step-{step}"
        step_dir.mkdir(parents=True, exist_ok=True)
        results = step_dir / "results.jsonl"
        results.write_text("".join(r.model_dump_json() + "\n" for g in groups for r in g.results))
        rollout = trl_rollout(groups, num_generations=self.args.num_generations, traces=TRACES)
        self.pending = StepRecord(step, version, groups, results, time.monotonic() - started, dict(dropped),
                                  rollout.env_mask)  # fmt: skip
        return rollout.to_kwargs()

    def sample(self, prompts: list[str], step: int, dropped: Counter[str]) -> list[Group]:
        """One usable group per prompt, in the prompts' order. A group with a session that gives no sample (TRL
        needs exactly ``num_generations`` rows per prompt) is dropped and its prompt submitted again as a new task."""
        done: dict[int, Group] = {}
        for attempt in range(RETRIES + 1):
            ids = {f"{self.run_id}-step{step}-p{i}-a{attempt}": i for i in range(len(prompts)) if i not in done}
            tasks = [task(prompts[i], task_id, step, self.args) for task_id, i in ids.items()]
            stats = GroupStats()
            for group in self.client.groups(tasks, GroupConfig(min_usable_fraction=1.0), stats=stats):
                done[ids[group.task_id]] = group
            dropped.update(stats.dropped_by_reason())
            if len(done) == len(prompts):
                return [done[i] for i in range(len(prompts))]
        raise SystemExit(f"step {step}: {len(prompts) - len(done)} prompts gave no complete group in {RETRIES + 1} "
                         f"tries (dropped groups: {dict(dropped)})")  # fmt: skip


# ---- the callback: weights to vLLM, verify, the step's record ------------------------------------------------------


@dataclass
class LoadWeights(TrainerCallback):
    """At the end of every optimizer step: the new weights into ``checkpoints/vN``, ``client.load_weights`` (vLLM
    reloads in place, the version advances), the step's traces verified against the weights that sampled them, one
    line of ``steps.jsonl``."""

    rollouts: PolarRollouts
    base_model: Path
    models: dict[int, Path]
    records: list[dict[str, Any]] = field(default_factory=list)
    trained_since: float = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trained_since = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        pending, client, out = self.rollouts.pending, self.rollouts.client, self.rollouts.out
        assert pending is not None, "on_step_end before any rollout"
        # TRL samples inside the step (its _prepare_inputs): the training time is the step's time less the sampling
        training = time.monotonic() - self.trained_since - pending.sampling_seconds
        seconds = {"sampling": pending.sampling_seconds, "training": training}

        t = time.monotonic()
        folder = out / "checkpoints" / f"v{pending.policy_version + 1}"
        checkpoint = save_checkpoint(kwargs["model"], self.base_model, folder)
        new_version = client.load_weights(checkpoint).policy_version
        self.models[new_version] = checkpoint
        seconds["weight_loading"] = time.monotonic() - t

        t = time.monotonic()
        report = verify(pending.results, self.models[pending.policy_version], out / "polar-data" / "journal")
        seconds["verify"] = time.monotonic() - t

        rewards = [r for g in pending.groups for r in g.rewards]
        record = {
            "step": pending.step,
            "mean_reward": sum(rewards) / len(rewards),
            "min_reward": min(rewards),
            "max_reward": max(rewards),
            "reward_stderr": statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.0,
            "groups": len(pending.groups),
            "sessions": len(rewards),
            "dropped_groups": pending.dropped,
            "tokens_trained": sum(sum(mask) for mask in pending.env_masks),
            "split_sessions": sum(len(select_traces(r, "each")) > 1 for g in pending.groups for r in g.results),
            "policy_version": pending.policy_version,
            "new_policy_version": new_version,
            "sampled_with": str(self.models[pending.policy_version]),
            "checkpoint": str(checkpoint),
            "verify_ok": report["ok"],
            "verify_mean_abs_dlogprob": report["mean_abs_dlogprob"],
            "verify_max_abs_dlogprob": report["max_abs_dlogprob"],
            "verify_failed": report["failed"],
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
        }
        self.records.append(record)
        with (out / "steps.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(row(record), flush=True)
        if not report["ok"]:
            print(f"  polar verify failed on step {pending.step}: {report['failed'] or report['structural']}")


COLUMNS = [("step", 4), ("reward", 7), ("min-max", 9), ("groups", 6), ("tokens", 6), ("version", 7), ("|Δlp|", 8),
           ("sample s", 8), ("train s", 7), ("load s", 6), ("verify s", 8)]  # fmt: skip


def row(record: dict[str, Any]) -> str:
    s, verified = record["seconds"], record["verify_mean_abs_dlogprob"]
    values = [record["step"], f"{record['mean_reward']:.3f}", f"{record['min_reward']:.1f}-{record['max_reward']:.1f}",
              record["groups"], record["tokens_trained"], f"{record['policy_version']}→{record['new_policy_version']}",
              "-" if verified is None else f"{verified:.1e}", f"{s['sampling']:.1f}", f"{s['training']:.1f}",
              f"{s['weight_loading']:.1f}", f"{s['verify']:.1f}"]  # fmt: skip
    return "  ".join(str(v).rjust(width) for v, (_, width) in zip(values, COLUMNS, strict=True))


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Mean reward per step with a band of one standard error of that mean (the reward is 0 or 1, so a min-max band
    says nothing). grpo_tiny's plot has its own title and band; examples/grpo_tiny is part of tiny_agent's cache key,
    so it is left as it is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in records]
    means = [r["mean_reward"] for r in records]
    ax.plot(steps, means, marker="o", label="mean reward")
    ax.fill_between(steps, [m - r["reward_stderr"] for m, r in zip(means, records, strict=True)],
                    [m + r["reward_stderr"] for m, r in zip(means, records, strict=True)], alpha=0.2,
                    label="± 1 standard error")  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set(xlabel="step", ylabel="reward (1: the file holds the line)", title="trl_grpo: TRL GRPOTrainer, polar serve")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the trainer ----------------------------------------------------------------------------------------------------


def trainable(model: Any, which: str) -> None:
    """``--train``: ``all`` the weights; ``layers``, all but the input embeddings and ``lm_head``; ``final-norm``, only
    the final RMSNorm's weight (one scale per hidden dimension before ``lm_head``)."""
    if which == "layers":
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            module.requires_grad_(False)
    elif which == "final-norm":
        model.requires_grad_(False)
        model.model.norm.requires_grad_(True)


class PositiveAdvantages(GRPOTrainer):
    """``--advantages positive``: TRL's group-relative advantages with the negative ones set to 0, so a step raises
    the successful sessions' tokens and leaves the failed sessions' alone (TRL 1.16 computes the advantages in
    ``_generate_and_score_completions``)."""

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super()._generate_and_score_completions(inputs)
        batch["advantages"] = batch["advantages"].clamp(min=0.0)
        return batch


def trl_config(args: argparse.Namespace, out: Path) -> GRPOConfig:
    """TRL's GRPO on the CPU, one generation batch per optimizer step (``steps_per_generation`` 1, one iteration):
    every batch is sampled by the weights being trained, so TRL needs no importance correction and the recorded
    logprobs are what ``polar verify`` checks. ``prompts_per_step`` groups of ``num_generations`` rows a step."""
    return GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        optim=args.optim,
        learning_rate=args.lr if args.lr is not None else LEARNING_RATES[args.train],
        lr_scheduler_type="constant",
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        steps_per_generation=1,
        num_iterations=1,
        temperature=args.temperature,  # the sampling temperature the tasks ask the proxy for
        beta=args.beta,
        entropy_coef=args.entropy_coef,
        loss_type=args.loss_type,
        scale_rewards=args.scale_rewards,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        seed=args.seed,
        data_seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    # version 1 is a copy in the run's folder: vLLM, the checkpoints' tokenizer files and verify read it all run long,
    # and tiny_agent's cache drops a build when another build replaces it
    base_model = out / "checkpoints" / "v1"
    if not (base_model / "model.safetensors").exists():
        shutil.copytree(args.model.resolve() if args.model else tiny_agent.cached_model(), base_model)
    (out / "steps.jsonl").write_text("")
    failed_verify: list[int] = []

    with ExitStack() as stack:
        print(f"starting vLLM on {base_model} and polar serve (logs in {out}) ...", flush=True)
        # --enable-scale-out: vLLM's token-in routes (token mode)
        extra_args = ["--reasoning-parser", tiny_agent.REASONING_PARSER, "--enable-scale-out"]
        vllm_url = start_vllm(stack, base_model, out, args.vllm_venv, tiny_agent.MAX_MODEL_LEN, extra_args)
        info = start_polar(stack, vllm_url, out)
        client = stack.enter_context(PolarClient(info["url"], info["token"], timeout=120))
        rollouts = PolarRollouts(client, out, args)
        callback = LoadWeights(rollouts, base_model, {client.inference().policy_version: base_model})
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
        trainable(model, args.train)
        trainer = (PositiveAdvantages if args.advantages == "positive" else GRPOTrainer)(
            model=model,
            processing_class=AutoTokenizer.from_pretrained(base_model),
            reward_funcs=[polar_reward_func],
            args=trl_config(args, out),
            train_dataset=Dataset.from_list([{"prompt": prompt} for prompt in PROMPTS]),
            rollout_func=rollouts,
            callbacks=[callback],
        )
        print("  ".join(name.rjust(width) for name, width in COLUMNS), flush=True)
        trainer.train()
        failed_verify = [r["step"] for r in callback.records if not r["verify_ok"]]

    if args.plot:
        plot(callback.records, out / "reward.png")
        print(f"wrote {out / 'steps.jsonl'} and {out / 'reward.png'}")
    if failed_verify:
        print(f"polar verify --recompute failed on steps {failed_verify}", file=sys.stderr)
        return 1
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (weight updates)")
    parser.add_argument("--out", type=Path, default=Path("trl-grpo-out"), help="where everything is written")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="distinct prompts (GRPO groups) per step")
    parser.add_argument("--num-generations", type=int, default=8, help="sessions per prompt (TRL's num_generations)")
    parser.add_argument("--max-tokens", type=int, default=128, help="cap on each model call's sampled tokens")
    parser.add_argument("--timeout", type=int, default=120, help="seconds a session may run")
    parser.add_argument("--optim", choices=["adamw_torch", "sgd"], default="adamw_torch", help="sgd: no momentum")
    parser.add_argument("--train", choices=["final-norm", "layers", "all"], default="final-norm",
                        help="what TRL trains: the final norm, all but embeddings and lm_head, or all")  # fmt: skip
    parser.add_argument("--lr", type=float, help="learning rate (constant; default 1e-1 for --train final-norm, "
                        "else 2e-4)")  # fmt: skip
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature (the proxy's and TRL's logprobs')")  # fmt: skip
    parser.add_argument("--scale-rewards", choices=["group", "batch", "none"], default="group",
                        help="TRL's advantage scaling: by the group's std, the batch's, or none")  # fmt: skip
    parser.add_argument("--beta", type=float, default=0.0, help="TRL's KL coefficient (0: no reference model)")
    parser.add_argument("--entropy-coef", type=float, default=0.0,
                        help="TRL's entropy bonus (negative: the mean token entropy is minimized)")  # fmt: skip
    parser.add_argument("--advantages", choices=["grpo", "positive"], default="grpo",
                        help="positive: TRL's advantages with the negative ones set to 0")  # fmt: skip
    parser.add_argument("--loss-type", choices=["dapo", "grpo", "dr_grpo", "bnpo"], default="dapo",
                        help="TRL's loss aggregation (grpo: each completion's tokens averaged first)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="TRL's seed (data order)")
    parser.add_argument("--model", type=Path, help="start from this model folder (default: tiny_agent's cached model)")
    default_venv = os.environ.get("POLAR_VLLM_VENV") or str(Path.home() / ".cache" / "polar" / "vllm-venv")
    parser.add_argument("--vllm-venv", type=Path, default=Path(default_venv), help="vLLM's CPU venv")
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="no reward.png (no matplotlib needed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before any work, as grpo_tiny does
        print("trl_grpo plots reward.png with matplotlib, which is not installed: pip install matplotlib (it comes "
              "with Polar's train extra), or pass --no-plot", file=sys.stderr)  # fmt: skip
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds like Ctrl-C: the servers stop
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
