"""A closed GRPO loop on the CPU: vLLM samples, ``polar serve`` runs a real harness, plain PyTorch trains, vLLM
reloads the new weights in place, ``polar verify --recompute`` checks every step's traces (README.md here).

    bash examples/grpo_tiny/run.sh [--steps N] [--out DIR]

One step:

1. sampling: ``client.groups(...)`` runs ``--groups`` tasks of ``--samples`` sessions each. Each session is Polar's
   reference agent (the ``shell`` harness) answering "Reply with digits only."; the proxy forces temperature 1.0 and
   caps each call at ``--max-tokens``; the ``test_on_output`` evaluator scores the answer in the session's runtime.
2. building: each usable trace becomes a sample: prompt + response ids, its loss mask, its recorded logprobs (the
   behaviour policy: vLLM's raw logprobs, which at temperature 1.0 are the sampling distribution's) and its
   advantage from ``polar_cli.trainers.advantages`` (``--advantage``: GRPO by default, the reward minus the group's
   mean over the group's standard deviation; or Dr. GRPO, RLOO).
3. training: ``--epochs`` full-batch PPO updates with the clipped importance ratio against the recorded logprobs,
   the loss on mask-1 tokens only.
4. weight loading: ``save_pretrained`` into a new folder, ``client.load_weights(folder)``: every vLLM replica reloads
   in place and the policy version advances.
5. verify: ``polar verify step-N/results.jsonl --recompute --model FOLDER`` against the weights that sampled them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import httpx
import torch
from transformers import AutoModelForCausalLM

from polar_cli.client import PolarClient
from polar_cli.groups import Group, GroupConfig, GroupStats
from polar_cli.harnesses.shell import REFERENCE_AGENT, reference_agent_source
from polar_cli.models import TaskRequest
from polar_cli.recompute import load_traces, recompute
from polar_cli.trainers.advantages import Estimator, group_advantages

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "polar-demo"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# ---- the task and its reward -------------------------------------------------------------------------------------

INSTRUCTION = "Reply with digits only."
# The evaluator's check, run in the session's runtime after the agent: 100 checks, check k passes when at least k% of
# the answer's characters are ASCII digits. With `scoring: fraction` the reward is the share of checks passed, i.e.
# floor(100 * digits / characters) / 100, and 0.0 for an empty answer.
CHECK = r"""
import pathlib
answer = pathlib.Path("answer.txt").read_text(encoding="utf-8", errors="replace").strip()
digits = sum(c in "0123456789" for c in answer)
for k in range(1, 101):
    print("PASSED" if answer and 100 * digits >= k * len(answer) else "FAILED", f"digits::at_least_{k}_percent")
"""
CHECK_IDS = [f"digits::at_least_{k}_percent" for k in range(1, 101)]


def task(run_id: str, step: int, index: int, args: argparse.Namespace) -> TaskRequest:
    """One GRPO group: ``args.samples`` sessions of the reference agent on the same instruction."""
    return TaskRequest.model_validate(
        {
            "task_id": f"{run_id}-step{step}-group{index}",
            "instruction": INSTRUCTION,
            "num_samples": args.samples,
            "timeout_seconds": 300,
            "agent": {
                "harness": "shell",
                # the reference agent prints its final answer; the evaluator reads it from answer.txt
                "config": {
                    "command": f'exec node "$HOME/{REFERENCE_AGENT}" > answer.txt',
                    "files": {REFERENCE_AGENT: reference_agent_source()},
                },
                # what the proxy forces on every call: the full distribution (its raw logprobs are the behaviour
                # policy's), and a short answer
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": args.max_tokens},
            },
            "builder": {"strategy": "prefix_merging"},
            "evaluator": {
                "strategy": "test_on_output",
                "config": {"command": ["python3", "-c", CHECK], "expected_pass": CHECK_IDS, "scoring": "fraction"},
            },
            "metadata": {"group_id": f"step{step}-group{index}", "rollout_step": step},
        }
    )


# ---- servers -----------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process(argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> Iterator[None]:
    """A server process (in its own process group, with its children) for the ``with`` block; SIGTERM, then
    SIGKILL after 30 s, when the block ends however it ends."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    try:
        yield
    finally:
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def wait_until(ready: Any, what: str, log: Path, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            value = ready()
            if value:
                return value
        except (OSError, ValueError, httpx.HTTPError):
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise SystemExit(f"{what} did not start within {within:.0f} s; the end of {log}:\n{tail}")


def start_vllm(
    stack: ExitStack, model_dir: Path, out: Path, venv: Path, max_model_len: int = 4096, extra_args: Sequence[str] = ()
) -> str:
    """vLLM's CPU build on ``model_dir`` in dev mode (the weight-reload route), fp32, eager, the hermes tool-call
    parser (and ``extra_args``); returns its URL."""
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(max_model_len), "--dtype", "float32", "--enforce-eager", "--seed", "0",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *extra_args]  # fmt: skip
    log = out / "vllm.log"
    stack.enter_context(process(argv, log, env=env, cwd=out))
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/v1/models", timeout=2).status_code == 200, "vLLM", log, within=600)
    return url


def start_polar(stack: ExitStack, vllm_url: str, out: Path) -> dict[str, Any]:
    """``polar serve`` (server and gateway in one process) over that vLLM; returns its serve.json (url, token)."""
    data_dir = out / "polar-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    argv = [sys.executable, "-m", "polar_cli", "serve", "--data-dir", str(data_dir), "--port", "0", "--token", token,
            "--backend", "vllm", "--backend-url", vllm_url, "--model", MODEL_NAME]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = out / "serve.log"
    stack.enter_context(process(argv, log, env=env, cwd=out))

    def serve_json() -> dict[str, Any] | None:
        info: dict[str, Any] = json.loads((data_dir / "serve.json").read_text())
        return info if info.get("token") == token else None

    info: dict[str, Any] = wait_until(serve_json, "polar serve", log, within=120)
    return info


# ---- building the batch ------------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One trace as the trainer sees it."""

    input_ids: list[int]  # prompt + response
    prompt_len: int
    mask: list[int]  # over the response: 1 = sampled by the policy (in the loss), 0 = not
    old_logprobs: list[float]  # the recorded (behaviour) logprob of each response token; used where mask is 1
    advantage: float


def build_batch(groups: list[Group], estimator: Estimator = "grpo") -> list[Sample]:
    """Every usable trace of ``groups``, each with its session's advantage in its group (``polar_cli.trainers``:
    GRPO by default; all zero in a group whose rewards are all equal)."""
    samples = []
    for group in groups:
        for result, advantage in zip(group.results, group_advantages(group, estimator).tolist(), strict=True):
            for trace in result.trajectory.traces:
                if not trace.trainable or trace.reward is None or trace.response_logprobs is None:
                    continue
                samples.append(
                    Sample(
                        input_ids=trace.prompt_ids + trace.response_ids,
                        prompt_len=len(trace.prompt_ids),
                        mask=trace.loss_mask,
                        old_logprobs=[entry["logprob"] for entry in trace.response_logprobs],
                        advantage=advantage,
                    )
                )
    return samples


# ---- training ----------------------------------------------------------------------------------------------------


def response_logprobs(model: Any, batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward pass over the batch (right-padded): the model's logprob of each response token given everything
    before it, with the recorded logprobs and the loss mask laid out the same way ([samples, longest response])."""
    width = max(len(s.input_ids) for s in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    attention = torch.zeros(len(batch), width, dtype=torch.long)
    for i, s in enumerate(batch):
        ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
        attention[i, : len(s.input_ids)] = 1
    hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
    span = max(len(s.mask) for s in batch)
    new = torch.zeros(len(batch), span)
    old = torch.zeros(len(batch), span)
    mask = torch.zeros(len(batch), span)
    for i, s in enumerate(batch):
        n, start = len(s.mask), s.prompt_len
        # the hidden state at position p predicts token p + 1; the output layer only where the response is
        logprobs = torch.log_softmax(model.lm_head(hidden[i, start - 1 : start - 1 + n]).float(), dim=-1)
        new[i, :n] = logprobs.gather(-1, ids[i, start : start + n, None])[:, 0]
        old[i, :n] = torch.tensor(s.old_logprobs)
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
    return new, old, mask


def train_step(model: Any, optimizer: torch.optim.Optimizer, batch: list[Sample], args: argparse.Namespace) -> dict:
    """``args.epochs`` full-batch updates of the PPO-clipped GRPO loss, averaged over every mask-1 token of the
    batch. Returns the first forward pass's mean |trainer - recorded| logprob (the weights that sampled the batch, so
    it should be ~0: the behaviour policy is what the trainer computes) and the last epoch's clip fraction."""
    advantage = torch.tensor([s.advantage for s in batch])[:, None]
    stats: dict[str, float] = {}
    model.train()
    for epoch in range(args.epochs):
        optimizer.zero_grad()
        new, old, mask = response_logprobs(model, batch)
        tokens = mask.sum()
        ratio = torch.exp((new - old) * mask)  # 1 where mask is 0: tokens the policy never sampled
        unclipped = ratio * advantage
        clipped = torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * advantage
        loss = -(torch.minimum(unclipped, clipped) * mask).sum() / tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if epoch == 0:
            stats["tokens_trained"] = int(tokens)
            stats["trainer_mean_abs_dlogprob"] = float(((new.detach() - old).abs() * mask).sum() / tokens)
        stats["clip_fraction"] = float(((unclipped != clipped).float() * mask).sum() / tokens)
    return stats


def write_base_model(folder: Path, seed: int) -> None:
    """Version 1: the random-weight demo model (polar_cli/demo_model.py) with its output layer untied from the input
    embedding. vLLM's in-place reload leaves a tied output layer at the weights the server started with (README,
    "Why the output layer is untied"); untied, ``lm_head.weight`` is in every checkpoint and is reloaded like the
    rest."""
    demo = folder.with_name(folder.name + "-demo")
    subprocess.run([sys.executable, "-P", str(ROOT / "polar_cli" / "demo_model.py"), "model", str(demo),
                    "--seed", str(seed)], check=True, capture_output=True)  # fmt: skip
    model: Any = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    save_checkpoint(model, demo, folder)
    shutil.rmtree(demo)


def save_checkpoint(model: Any, tokenizer_from: Path, folder: Path) -> Path:
    """The weights (safetensors) and config, plus the tokenizer files so ``polar verify`` can use the folder alone."""
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, folder / name)
    return folder


# ---- verification ------------------------------------------------------------------------------------------------


def verify(results: Path, model_dir: Path, journal: Path) -> dict[str, Any]:
    """``polar verify RESULTS --recompute --model MODEL_DIR --journal JOURNAL --json``, in process (the CLI would
    import torch and transformers again at every step): every sampled token's recorded logprob against the weights
    that sampled it, and the traces against the journal of their model calls."""
    report = recompute(load_traces(results, journal=journal), {None: model_dir})
    return report.model_dump(mode="json")


# ---- the report --------------------------------------------------------------------------------------------------

COLUMNS = [("step", 4), ("reward", 7), ("groups", 6), ("tokens", 6), ("version", 7), ("|Δlp|", 8),
           ("sample s", 8), ("build s", 7), ("train s", 7), ("load s", 6), ("verify s", 8)]  # fmt: skip


def row(record: dict[str, Any]) -> str:
    s = record["seconds"]
    verified = record["verify_mean_abs_dlogprob"]
    values = [record["step"], f"{record['mean_reward']:.3f}", record["usable_groups"], record["tokens_trained"],
              f"{record['policy_version']}→{record['new_policy_version']}",
              "-" if verified is None else f"{verified:.1e}", f"{s['sampling']:.1f}", f"{s['building']:.2f}",
              f"{s['training']:.1f}", f"{s['weight_loading']:.1f}", f"{s['verify']:.1f}"]  # fmt: skip
    return "  ".join(str(v).rjust(width) for v, (_, width) in zip(values, COLUMNS, strict=True))


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in records]
    ax.plot(steps, [r["mean_reward"] for r in records], marker="o", label="mean reward")
    ax.fill_between(steps, [r["min_reward"] for r in records], [r["max_reward"] for r in records], alpha=0.2,
                    label="min-max")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("reward (share of digits in the answer)")
    ax.set_title("grpo_tiny: GRPO through polar serve")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the loop ----------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    base_model = out / "checkpoints" / "v1"
    if not (base_model / "model.safetensors").exists():
        write_base_model(base_model, args.model_seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    steps_file = out / "steps.jsonl"
    steps_file.write_text("")
    records: list[dict[str, Any]] = []
    failed_verify = []
    run_id = f"grpo-{secrets.token_hex(4)}"

    with ExitStack() as stack:
        print(f"starting vLLM and polar serve (logs in {out}) ...", flush=True)
        vllm_url = start_vllm(stack, base_model, out, args.vllm_venv)
        info = start_polar(stack, vllm_url, out)
        client = stack.enter_context(PolarClient(info["url"], info["token"], timeout=120))
        models = {client.inference().policy_version: base_model}  # policy version -> the weights that sampled it
        print("  ".join(name.rjust(width) for name, width in COLUMNS), flush=True)

        for step in range(args.steps):
            seconds: dict[str, float] = {}
            version = client.inference().policy_version

            t = time.monotonic()
            stats = GroupStats()
            tasks = [task(run_id, step, i, args) for i in range(args.groups)]
            groups = list(client.groups(tasks, GroupConfig(min_usable_fraction=0.5), stats=stats))
            seconds["sampling"] = time.monotonic() - t
            step_dir = out / f"step-{step}"
            step_dir.mkdir(exist_ok=True)
            results = step_dir / "results.jsonl"
            results.write_text("".join(r.model_dump_json() + "\n" for g in groups for r in g.results))

            t = time.monotonic()
            batch = build_batch(groups, args.advantage)
            seconds["building"] = time.monotonic() - t

            t = time.monotonic()
            trained = train_step(model, optimizer, batch, args) if batch else {"tokens_trained": 0}
            seconds["training"] = time.monotonic() - t

            t = time.monotonic()
            checkpoint = save_checkpoint(model, base_model, out / "checkpoints" / f"v{version + 1}")
            new_version = client.load_weights(checkpoint).policy_version
            models[new_version] = checkpoint
            seconds["weight_loading"] = time.monotonic() - t

            t = time.monotonic()
            report = verify(results, models[version], out / "polar-data" / "journal")
            seconds["verify"] = time.monotonic() - t
            if not report["ok"]:
                failed_verify.append(step)

            rewards = [r for g in groups for r in g.rewards]
            record = {
                "step": step,
                "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
                "min_reward": min(rewards, default=0.0),
                "max_reward": max(rewards, default=0.0),
                "usable_groups": len(groups),
                "dropped_groups": stats.dropped_by_reason(),
                "sessions": len(rewards),
                "traces": len(batch),
                "tokens_trained": trained["tokens_trained"],
                "policy_version": version,
                "new_policy_version": new_version,
                "checkpoint": str(checkpoint),
                "verify_ok": report["ok"],
                "verify_mean_abs_dlogprob": report["mean_abs_dlogprob"],
                "verify_max_abs_dlogprob": report["max_abs_dlogprob"],
                "verify_failed": report["failed"],
                "trainer_mean_abs_dlogprob": trained.get("trainer_mean_abs_dlogprob"),
                "clip_fraction": trained.get("clip_fraction"),
                "seconds": {k: round(v, 3) for k, v in seconds.items()},
            }
            records.append(record)
            with steps_file.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(row(record), flush=True)
            if not report["ok"]:
                print(f"  polar verify failed on step {step}: {report['failed'] or report['structural']}")

    if args.plot:
        plot(records, out / "reward.png")
        print(f"wrote {steps_file} and {out / 'reward.png'}")
    else:
        print(f"wrote {steps_file}")
    if failed_verify:
        print(f"polar verify --recompute failed on steps {failed_verify}", file=sys.stderr)
        return 1
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (weight updates)")
    parser.add_argument("--out", type=Path, default=Path("grpo-tiny-out"), help="where everything is written")
    parser.add_argument("--groups", type=int, default=4, help="tasks (GRPO groups) per step")
    parser.add_argument("--samples", type=int, default=8, help="sessions per group")
    parser.add_argument("--max-tokens", type=int, default=16, help="cap on each model call's sampled tokens")
    parser.add_argument("--lr", type=float, default=2e-2, help="AdamW learning rate")
    parser.add_argument("--epochs", type=int, default=2, help="PPO updates per batch")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range of the importance ratio")
    parser.add_argument("--advantage", choices=get_args(Estimator), default="grpo",
                        help="the advantage estimator (polar_cli.trainers.advantages)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the trainer")
    parser.add_argument("--model-seed", type=int, default=1234, help="seed of the demo model's random weights")
    default_venv = os.environ.get("POLAR_VLLM_VENV") or str(Path.home() / ".cache" / "polar" / "vllm-venv")
    parser.add_argument("--vllm-venv", type=Path, default=Path(default_venv), help="vLLM's CPU venv")
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="no reward.png (no matplotlib needed)")
    return parser.parse_args(argv)


def missing_plot_dependency(args: argparse.Namespace) -> str | None:
    """Why the run cannot plot (matplotlib missing), checked before any work starts; None when it can or need not."""
    if not args.plot:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("grpo_tiny plots reward.png with matplotlib, which is not installed: pip install matplotlib (it comes "
                "with Polar's train extra), or pass --no-plot")  # fmt: skip
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if (why := missing_plot_dependency(args)) is not None:
        print(why, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds like Ctrl-C: the servers stop
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
