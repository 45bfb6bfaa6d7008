"""``examples/grpo_tiny`` (issue 21 item 5): its closed loop runs on vLLM's CPU build with a short budget. Two GRPO
steps: two weight updates loaded in place (policy version 1 -> 2 -> 3), every trace carries the version that sampled
it, ``polar verify --recompute`` passes at each step against that step's weights, and fails, naming the trace, on a
trace re-tokenized from its text. The example prints its time split per step (sampling, building, training, weight
loading, verify).

Without the vLLM venv (.ci/setup_vllm.sh) the test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar_cli.models import SessionResult
from tests.support.vllm import require_vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-3
PHASES = {"sampling", "building", "training", "weight_loading", "verify"}


def polar_verify(*args: str) -> tuple[int, dict]:
    argv = [sys.executable, "-m", "polar_cli", "verify", *args, "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode, json.loads(done.stdout)


def retokenized(results: Path, model_dir: Path, out: Path) -> str:
    """``results`` with one trace's response rebuilt from its text (decode, then encode with the model's tokenizer;
    the first trace whose ids change), the recorded logprobs left in place; returns that trace's ref prefix."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    for row in rows:
        for index, trace in enumerate(row["trajectory"]["traces"]):
            ids = trace["response_ids"]
            rebuilt = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)
            if rebuilt == ids:
                continue
            logprobs = [entry["logprob"] for entry in trace["response_logprobs"]]
            trace["response_ids"] = rebuilt
            trace["loss_mask"] = [1] * len(rebuilt)
            trace["response_logprobs"] = [
                {"token": None, "token_id": token, "logprob": logprobs[min(i, len(logprobs) - 1)]}
                for i, token in enumerate(rebuilt)
            ]
            out.write_text("".join(json.dumps(r) + "\n" for r in rows))
            return f"session {row['session_id']} trace {index}"
    raise AssertionError("decode/encode gave back the sampled ids of every trace: nothing to catch")


def test_the_grpo_loop_updates_the_weights_twice_and_every_step_verifies(tmp_path: Path) -> None:
    python = require_vllm_python()
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "POLAR_VLLM_VENV": str(python.parent.parent)}
    argv = ["bash", str(ROOT / "examples" / "grpo_tiny" / "run.sh"), "--steps", "2", "--groups", "2", "--samples", "4",
            "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    header = next(line for line in done.stdout.splitlines() if line.strip().startswith("step"))
    for column in ("sample s", "build s", "train s", "load s", "verify s"):  # the time split per step
        assert column in header
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1]
    assert [(s["policy_version"], s["new_policy_version"]) for s in steps] == [(1, 2), (2, 3)]  # two weight updates
    for s in steps:
        assert s["usable_groups"] >= 1 and s["tokens_trained"] > 0, s
        assert set(s["seconds"]) == PHASES and all(v >= 0 for v in s["seconds"].values())
        assert s["verify_ok"] and s["verify_mean_abs_dlogprob"] < TOLERANCE, s
        assert s["trainer_mean_abs_dlogprob"] < TOLERANCE, s  # the trainer's own forward agrees too
        results = [SessionResult.model_validate_json(line)
                   for line in (out / f"step-{s['step']}" / "results.jsonl").read_text().splitlines()]  # fmt: skip
        traces = [trace for result in results for trace in result.trajectory.traces]
        assert traces and all(result.reward is not None for result in results)
        for trace in traces:  # every trace carries the version that sampled it
            versions = trace.policy_versions
            assert versions is not None and versions.oldest == versions.newest == s["policy_version"], versions
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the CLI agrees with the loop's in-process verify on step 1, against the weights that sampled it (version 2) ...
    step1, weights = out / "step-1" / "results.jsonl", out / "checkpoints" / "v2"
    journal = out / "polar-data" / "journal"
    code, report = polar_verify(str(step1), "--recompute", "--model", str(weights), "--journal", str(journal))
    assert code == 0 and report["ok"] and report["mean_abs_dlogprob"] < TOLERANCE, report
    assert report["structural"]["checked"] == report["traces"] > 0

    # ... and fails, naming it, on one of its traces re-tokenized from its text
    ref = retokenized(step1, weights, tmp_path / "retokenized.jsonl")
    code, report = polar_verify(str(tmp_path / "retokenized.jsonl"), "--recompute", "--model", str(weights),
                                "--journal", str(journal))  # fmt: skip
    assert code == 1 and not report["ok"], report
    assert len(report["failed"]) == 1 and report["failed"][0].startswith(ref), report["failed"]
    assert report["worst"][0]["ref"].startswith(ref) and report["worst"][0]["mean_abs_dlogprob"] > TOLERANCE
