"""A tiny tool-calling model made from Polar's own data (README.md here): a scripted teacher, ``polar generate``,
``polar export``, supervised fine-tuning on the exported traces, and vLLM's CPU build serving the result to real CLIs.

    bash examples/tiny_agent/run.sh [--out DIR] [--steps N] [--eval-samples K]

1. tasks: "create FILE containing exactly the line: LINE", for pi, the shell harness's reference agent, codex and
   claude_code; each task carries its scripted-backend script (the teacher): one call of the harness's own shell tool
   writing the file, then a short final answer.
2. ``polar generate --backend scripted`` runs them through the real CLIs; ``polar export`` writes the ``traces`` config.
3. SFT: the demo model (polar_cli/demo_model.py: its tokenizer and its 2-layer Qwen2 architecture) with sliding-window
   attention and an untied output layer, trained on the exported traces' mask-1 tokens. With a window of ``W`` tokens
   per layer, a token sees at most ``2W`` tokens back, so a training window of the ``2W`` tokens before each assistant
   turn plus the turn gives exactly the logits the full 12K-35K-token prompt gives: minutes on a CPU, not hours.
4. eval (``--eval-samples K`` > 0): vLLM serves the model with the hermes tool-call parser; ``polar run`` runs each
   task K times per harness; prints the tool-call rate and the task success.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import string
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grpo_tiny"))
from grpo import MODEL_NAME, save_checkpoint, start_vllm, write_base_model

from polar_cli.models.task import SCRIPT_KEY
from polar_cli.registry import get_harness

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
HARNESSES = ("pi", "shell", "codex", "claude_code")
# (file, line): the tasks; the model learns to write each one with its harness's shell tool
TASKS = (("hello.txt", "hello polar"), ("notes.txt", "buy milk"), ("todo.txt", "write tests"), ("plan.txt", "ship it"))
FINAL_ANSWER = "Done."
# what the teacher thinks before each turn: the model learns to reason first (<think>...</think>), as a reasoning
# model does; vLLM's <think> reasoning parsers read an answer without <think> as reasoning, so every turn thinks
TOOL_REASONING = "I will write the file with the shell tool."
FINAL_REASONING = "The file is written."
REASONING_PARSER = "deepseek_r1"  # vLLM's parser for <think>...</think> at the start of an answer
SLIDING_WINDOW = 128  # tokens each layer attends back; 2 layers see 2 * SLIDING_WINDOW
MAX_POSITIONS = 65536  # the CLIs' prompts reach ~35K tokens in the tiny vocabulary; RoPE only ever sees < 2W apart
MAX_MODEL_LEN = 65536
# what differs between two sessions of one task and is no part of what the model learns: the session's id and work
# dir (a random name), the day, codex's per-call chunk id and timing. The training windows show each of VARIANTS
# fixed values of them (seeded by the task), the same whatever the sessions' own, so that the same inputs give the
# same weights, and the model does not key on them (trained on one day and chunk id, a model gave the teacher's
# codex turns probability 0.0004 with another's); the gate's day is none of TRAINING_DATES
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
CHUNK_ID = re.compile(r"Chunk ID: [0-9a-f]+")
WALL_TIME = re.compile(r"Wall time: [0-9.]+ seconds")
TRAINING_DATES = ("2024-03-17", "2025-12-02", "2026-07-28", "2028-10-09", "2030-05-21")
VARIANTS = len(TRAINING_DATES)
HELD_OUT_DATE = "2027-09-13"
GATE_TEMPERATURE = 0.5  # the tests' sampling temperature (tests/examples/test_tiny_agent.py, test_token_mode_vllm.py)


# ---- tasks ------------------------------------------------------------------------------------------------------


def instruction(file: str, line: str) -> str:
    return f"Create a file {file} in the current directory containing exactly the line: {line}"


def teacher_script(harness: str, file: str, line: str) -> list[dict[str, Any]]:
    """The scripted teacher: one call of the harness's own shell tool, then the final answer (its doctor script's
    shape, polar_cli/interfaces/harness.py), each after a short reasoning."""
    script = get_harness(harness).doctor_script(f"echo '{line}' > {file}")
    script[0]["tool_calls"][0]["id"] = "call_1"
    script[0]["reasoning_content"] = TOOL_REASONING
    script[-1]["content"] = FINAL_ANSWER
    script[-1]["reasoning_content"] = FINAL_REASONING
    return script


def task(harness: str, file: str, line: str, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """A TaskRequest (as a dict) for one harness and one (file, line); the teacher's script in its metadata."""
    agent: dict[str, Any] = {"harness": harness, "config": get_harness(harness).doctor_config()}
    if sampling:
        agent["sampling"] = sampling
    return {
        "task_id": f"tiny-{harness}-{file.split('.')[0]}",
        "instruction": instruction(file, line),
        "num_samples": 1,
        "timeout_seconds": 300,
        "runtime": {"backend": "local"},
        "agent": agent,
        "builder": {"strategy": "prefix_merging"},
        "evaluator": {"strategy": "test_on_output", "config": {"command": f'test "$(cat {file})" = "{line}"'}},
        "metadata": {"repo": f"tiny/{harness}", "harness": harness, SCRIPT_KEY: teacher_script(harness, file, line)},
    }


def eval_task(harness: str, file: str, line: str, max_tokens: int, temperature: float = 1.0) -> str:
    """The task for a served model (JSON): no script, sampling at ``temperature`` with ``max_tokens`` a call."""
    spec = task(harness, file, line, {"temperature": temperature, "top_p": 1.0, "max_tokens": max_tokens})
    spec["metadata"].pop(SCRIPT_KEY)
    return json.dumps(spec)


def polar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "polar_cli", *args], capture_output=True, text=True, env=env, cwd=cwd)
    return done


def generate(out: Path, harnesses: tuple[str, ...], samples: int, tokenizer: Path) -> Path:
    """``polar generate`` with the scripted backend over every (harness, task), then ``polar export``. The teacher's
    sessions are tokenized with ``tokenizer``, a model folder's: as vLLM tokenizes for the served model (a folder
    with a ``config.json`` loads its model type's tokenizer, which splits digits one by one; the demo tokenizer's
    folder alone does not)."""
    tasks = out / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task(h, f, line)) + "\n" for h in harnesses for f, line in TASKS))
    rollouts, dataset = out / "rollouts", out / "dataset"
    done = polar("generate", "--dataset", "tasks_file", "-O", f"path={tasks}", "--backend", "scripted",
                 "--out", str(rollouts), "--samples", str(samples), "--concurrency", "4", "--max-retries", "1",
                 "--group-by", "harness", "--tokenizer", str(tokenizer))  # fmt: skip
    print(done.stderr[-3000:], end="")
    if done.returncode != 0:
        raise SystemExit(f"polar generate failed ({done.returncode})")
    done = polar("export", str(rollouts), "--to", str(dataset), "--accepted-only", "--overwrite")
    if done.returncode != 0:
        raise SystemExit(f"polar export failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dataset


# ---- SFT on windows -----------------------------------------------------------------------------------------------


Window = tuple[list[int], list[int], int]  # (ids, labels_mask, first_position)


@dataclass(frozen=True)
class Turn:
    """One assistant turn (a maximal run of mask-1 tokens) of a trainable trace: the trace's ids up to its end."""

    task_id: str
    sample: int
    index: int
    session_id: str
    ids: list[int]
    start: int


def turns(dataset: Path) -> list[Turn]:
    """Every assistant turn of every trainable trace in the exported ``traces`` config, by task, sample and turn."""
    from datasets import load_dataset

    # a cache of its own: the shared one is keyed so that another export in a folder of the same name can answer
    cache = dataset.parent / "hf-datasets-cache"
    rows = load_dataset(str(dataset), "traces", split="train", cache_dir=str(cache))
    out = []
    for row in rows:
        if not row["trainable"]:
            continue
        ids = list(row["prompt_ids"]) + list(row["response_ids"])
        mask = [0] * len(row["prompt_ids"]) + list(row["loss_mask"])
        i = index = 0
        while i < len(mask):
            if mask[i] != 1:
                i += 1
                continue
            end = i
            while end < len(mask) and mask[end] == 1:
                end += 1
            out.append(Turn(row["task_id"], row["sample_index"], index, row["session_id"], ids[:end], i))
            i, index = end, index + 1
    return sorted(out, key=lambda t: (t.task_id, t.sample, t.index))


def window(turn: Turn, tokenizer: Any, context: int, rewrite: Callable[[str], str], first: int | None) -> Window:
    """The ``context`` tokens before the turn and the turn, only the turn in the loss; the context's text passed
    through ``rewrite`` (re-tokenized from twice as far back when it changed, so the cut falls where the text is the
    same); ``first``: the first position (None: where the window sits in the session)."""
    before = turn.ids[max(0, turn.start - 2 * context) : turn.start]
    text = tokenizer.decode(before)
    changed = rewrite(text)
    ids = before if changed == text else tokenizer.encode(changed, add_special_tokens=False)
    ids = ids[-context:]
    answer = turn.ids[turn.start :]
    position = turn.start - len(ids) if first is None else first
    return ids + answer, [0] * len(ids) + [1] * len(answer), position


def variant(turn: Turn, k: int) -> Callable[[str], str]:
    """What varies between the sessions of one task, written the ``k``-th of VARIANTS fixed ways: the session id and
    work dir (the runtime's format, random-looking names seeded by the task and ``k``), the day, codex's chunk id
    and timing."""
    rng = random.Random(f"{turn.task_id} {k}")
    session = f"{turn.task_id}.s{k}.a1-0-{rng.getrandbits(32):08x}"
    workdir = f"local-{session}-" + "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    chunk = f"Chunk ID: {rng.getrandbits(24):06x}"
    wall = f"Wall time: {rng.randrange(100) / 10000:.4f} seconds"

    def rewrite(text: str) -> str:
        text = re.sub(rf"local-{re.escape(turn.session_id)}-[^/\s<>\"'`]+", workdir, text)
        text = text.replace(turn.session_id, session)
        text = WALL_TIME.sub(wall, CHUNK_ID.sub(chunk, text))
        return DATE.sub(TRAINING_DATES[k], text)

    return rewrite


def training_windows(data: list[Turn], tokenizer: Any, context: int) -> tuple[list[list[Window]], list[str]]:
    """The windows of every distinct (task, turn), one list each (the turn's window in each variant of the varying
    text, or one window when it shows none), positions from 0 (rotary embeddings see only
    relative positions), in task and turn order: the same inputs give the same windows whatever the sessions' work
    dirs, day, prompt lengths or order. Also the (task, turn)s whose sessions still differ (none expected)."""
    by_turn: dict[tuple[str, int], list[Window]] = {}
    varying = set()
    for turn in data:
        made = [window(turn, tokenizer, context, variant(turn, k), 0) for k in range(VARIANTS)]
        variants = [w for i, w in enumerate(made) if w not in made[:i]]
        seen = by_turn.setdefault((turn.task_id, turn.index), variants)
        if seen != variants:
            varying.add(f"{turn.task_id} turn {turn.index}")
            seen += [w for w in variants if w not in seen]
    return list(by_turn.values()), sorted(varying)


def gate_windows(data: list[Turn], tokenizer: Any, context: int) -> list[Window]:
    """The windows as a served session shows them, which training never saw: the session's own work dir, timings and
    positions, and another day."""
    return [window(turn, tokenizer, context, lambda text: DATE.sub(HELD_OUT_DATE, text), None) for turn in data]


def base_model(folder: Path, seed: int) -> Any:
    """The demo model (random weights of ``seed``), untied (examples/grpo_tiny), with every layer's attention
    limited to the last SLIDING_WINDOW tokens and positions for the CLIs' long prompts; written to ``folder``."""
    write_base_model(folder, seed)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.update(use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=0,
                  layer_types=["sliding_attention"] * config["num_hidden_layers"],
                  max_position_embeddings=MAX_POSITIONS)  # fmt: skip
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def batch_tensors(batch: list[Window]) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and true positions, and the mask of the trained tokens."""
    width = max(len(ids) for ids, _, _ in batch)
    input_ids = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    positions = torch.zeros((len(batch), width), dtype=torch.long)
    trained = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, (ids, mask, first) in enumerate(batch):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        positions[row, :n] = torch.arange(first, first + n)
        trained[row, :n] = torch.tensor(mask, dtype=torch.bool)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions, "trained": trained}


def trained_logits(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits predicting the trained tokens, and those tokens; the output layer runs only on those positions
    (the rest of a window is context)."""
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         position_ids=batch["position_ids"]).last_hidden_state  # fmt: skip
    targets = batch["trained"][:, 1:]
    return model.lm_head(hidden[:, :-1][targets]), batch["input_ids"][:, 1:][targets]


def loss_on(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the trained tokens."""
    logits, labels = trained_logits(model, batch)
    return torch.nn.functional.cross_entropy(logits, labels)


def turn_probability(model: Any, window: Window, temperature: float) -> float:
    """The probability that sampling at ``temperature`` gives the window's turn, token for token, after its
    context."""
    with torch.no_grad():
        logits, labels = trained_logits(model, batch_tensors([window]))
        logprobs = torch.log_softmax(logits / temperature, dim=-1).gather(1, labels[:, None])
    return math.exp(logprobs.sum().item())


def train(model: Any, data: list[list[Window]], args: argparse.Namespace, seed: int) -> list[float]:
    """AdamW (learning rate decaying linearly to 0) on the turns' windows, ``args.steps`` minibatches of
    ``args.batch`` turns in the order of ``seed``, a turn's next window (its next variant) at each visit; returns the
    losses."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / args.steps)  # linear to 0
    model.train()
    order: list[int] = []
    visits = [0] * len(data)
    losses = []
    for step in range(args.steps):
        if len(order) < args.batch:
            order += rng.sample(range(len(data)), len(data))
        picked, order = order[: args.batch], order[args.batch :]
        batch = []
        for i in picked:
            batch.append(data[i][visits[i] % len(data[i])])
            visits[i] += 1
        loss = loss_on(model, batch_tensors(batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  loss {loss.item():.4f}", flush=True)
    model.eval()
    return losses


# ---- eval on vLLM ---------------------------------------------------------------------------------------------------


def evaluate(model_dir: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """vLLM serves the model; ``polar run`` runs every task ``args.eval_samples`` times per harness. A session made
    the tool call when its first completion has one; it succeeded when its reward is 1.0."""
    report: dict[str, Any] = {}
    with ExitStack() as stack:
        url = start_vllm(stack, model_dir, out, args.vllm_venv, max_model_len=MAX_MODEL_LEN,
                         extra_args=["--reasoning-parser", REASONING_PARSER])  # fmt: skip
        for harness in args.harnesses:
            sessions = calls = tool_calls = successes = 0
            for file, line in TASKS:
                spec_path = out / "eval" / f"tiny-{harness}-{file.split('.')[0]}.json"
                spec_path.parent.mkdir(parents=True, exist_ok=True)
                spec_path.write_text(eval_task(harness, file, line, args.max_tokens))
                results = spec_path.with_suffix(".results.jsonl")
                polar("run", str(spec_path), "--backend", "vllm", "--backend-url", url, "--model", MODEL_NAME,
                      "--samples", str(args.eval_samples), "--out", str(results), "--overwrite", "--no-install",
                      "--data-dir", str(out / "eval" / "polar-data"))  # fmt: skip
                for row in (json.loads(x) for x in results.read_text().splitlines() if x) if results.exists() else []:
                    sessions += 1
                    calls += row["num_completions"]
                    tool_calls += row["num_completions"] >= 2
                    successes += (row.get("reward") or 0.0) >= 1.0
            report[harness] = {"sessions": sessions, "model_calls": calls,
                               "tool_call_rate": tool_calls / max(sessions, 1),
                               "success_rate": successes / max(sessions, 1)}  # fmt: skip
            print(
                f"  {harness:12s} sessions {sessions:3d}  model calls {calls:3d}  tool-call rate "
                f"{report[harness]['tool_call_rate']:.2f}  success {report[harness]['success_rate']:.2f}",
                flush=True,
            )
    return report


# ---- the CI's cached build --------------------------------------------------------------------------------------

# What the model is made of: this example, the pieces it reuses, the tokenizer and architecture, and the harness
# definitions whose prompts and tools the teacher's sessions record (their CLI versions are pinned in them).
INPUTS = (
    "examples/tiny_agent/tiny_agent.py",
    "examples/grpo_tiny/grpo.py",
    "polar_cli/demo_model.py",
    "polar_cli/harnesses/pi.py",
    "polar_cli/harnesses/shell.py",
    "polar_cli/harnesses/reference_agent.mjs",
    "plugins/polar-codex/polar_codex/__init__.py",
    "plugins/polar-claude-code/polar_claude_code/__init__.py",
)


def inputs_key() -> str:
    digest = hashlib.sha256()
    for name in INPUTS:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("POLAR_HOME") or Path.home() / ".cache" / "polar") / "tiny-agent"


def cached_model() -> Path:
    """The model built with the default settings, from ``cache_root()/<hash of INPUTS>/model``; built there first
    when missing (a folder is complete once renamed into place). Older builds are removed."""
    key = inputs_key()
    folder = cache_root() / key
    if (folder / "model" / "model.safetensors").exists():
        return folder / "model"
    build = cache_root() / f"{key}.build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    run(parse_args(["--out", str(build)]))
    for old in cache_root().iterdir():
        if old.is_dir() and old != build and not old.name.startswith(f"{key}.build"):
            shutil.rmtree(old, ignore_errors=True)
    build.rename(folder)
    return folder / "model"


# ---- main -----------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    started = time.monotonic()
    base_model(out / "base", args.model_seed)
    tokenizer = AutoTokenizer.from_pretrained(out / "base")  # what vLLM serving the model tokenizes with
    print(f"== generate + export ({', '.join(args.harnesses)}; {len(TASKS)} tasks, scripted teacher)", flush=True)
    dataset = generate(out, tuple(args.harnesses), args.samples, out / "base")
    times["generate"] = time.monotonic() - started
    recorded = turns(dataset)
    missing = sorted({task(h, f, line)["task_id"] for h in args.harnesses for f, line in TASKS}
                     - {t.task_id for t in recorded})  # fmt: skip
    if missing:
        raise SystemExit(f"no accepted session of {missing} (the ledger's attempts say why: {out / 'rollouts'})")
    data, varying = training_windows(recorded, tokenizer, 2 * SLIDING_WINDOW)
    if varying:
        print(f"warning: sessions of one task still differ after the rewriting: {varying}", flush=True)
    held_out = gate_windows(recorded, tokenizer, 2 * SLIDING_WINDOW)
    trained = sum(sum(windows[0][1]) for windows in data)
    print(f"== SFT: {len(data)} distinct turns of {len(recorded)} ({sum(map(len, data))} windows with the variants), "
          f"{trained} trained tokens, {args.steps} steps", flush=True)  # fmt: skip
    started = time.monotonic()
    losses: list[float] = []
    gate: list[dict[str, Any]] = []
    for round_ in range(args.gate_rounds):  # each round trains the base model afresh, in another order
        model = AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32)
        losses = train(model, data, args, args.seed + round_)
        probs = [turn_probability(model, w, GATE_TEMPERATURE) for w in held_out]
        worst = min(range(len(probs)), key=probs.__getitem__)
        gate.append(
            {
                "seed": args.seed + round_,
                "min_turn_probability": probs[worst],
                "mean_turn_probability": sum(probs) / len(probs),
                "worst": f"{recorded[worst].task_id} sample {recorded[worst].sample} turn {recorded[worst].index}",
            }
        )
        print(
            f"  gate, seed {args.seed + round_}: turn probability at temperature {GATE_TEMPERATURE} min "
            f"{probs[worst]:.4f} ({gate[-1]['worst']}), mean {gate[-1]['mean_turn_probability']:.4f}",
            flush=True,
        )
        if probs[worst] >= args.gate_min:
            break
    else:
        raise SystemExit(
            f"the model failed the gate in {args.gate_rounds} rounds: a held-out turn has probability "
            f"{gate[-1]['min_turn_probability']:.4f} < {args.gate_min} ({gate[-1]['worst']})"
        )
    model_dir = out / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    save_checkpoint(model, out / "base", model_dir)
    shutil.rmtree(out / "base")
    times["train"] = time.monotonic() - started
    summary: dict[str, Any] = {
        "windows": sum(map(len, data)),
        "distinct_turns": len(data),
        "turns": len(recorded),
        "varying_turns": varying,
        "final_loss": losses[-1],
        "gate": gate,
        "seconds": times,
        "digest": hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest(),
    }
    if args.eval_samples > 0:
        print(f"== eval on vLLM: {args.eval_samples} sessions per task and harness", flush=True)
        started = time.monotonic()
        summary["eval"] = evaluate(model_dir, out, args)
        times["eval"] = time.monotonic() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"== model: {model_dir}  (final loss {losses[-1]:.4f}; seconds {json.dumps(times)})", flush=True)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("tiny-agent-out"), help="where everything is written")
    parser.add_argument("--harnesses", nargs="+", default=list(HARNESSES), help="the CLIs the teacher plays")
    parser.add_argument("--samples", type=int, default=2, help="scripted sessions per task and harness")
    parser.add_argument("--steps", type=int, default=200, help="SFT steps (minibatches)")
    parser.add_argument("--batch", type=int, default=8, help="windows per minibatch")
    parser.add_argument("--lr", type=float, default=5e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="torch and data-order seed (round k: seed + k)")
    parser.add_argument(
        "--gate-min",
        type=float,
        default=0.9,
        help="gate: the least probability of each held-out turn at temperature 0.5",
    )
    parser.add_argument(
        "--gate-rounds",
        type=int,
        default=6,
        help="gate: trainings (seed, seed + 1, ...) at most before the build fails",
    )
    parser.add_argument("--model-seed", type=int, default=1234, help="seed of the demo model's random start weights")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--eval-samples", type=int, default=0, help="vLLM eval: sessions per task and harness")
    parser.add_argument("--max-tokens", type=int, default=256, help="eval: cap on each model call's sampled tokens")
    default_venv = os.environ.get("POLAR_VLLM_VENV") or str(Path.home() / ".cache" / "polar" / "vllm-venv")
    parser.add_argument("--vllm-venv", type=Path, default=Path(default_venv), help="vLLM's CPU venv (eval)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:] == ["--cached"]:  # .ci/setup_tiny_agent.sh
        print(cached_model())
        return 0
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
