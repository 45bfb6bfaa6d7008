"""``examples/trl_grpo`` (issue 34 item 3): TRL's ``GRPOTrainer`` trains tiny_agent's tool-calling model on Polar
rollouts, with a short budget: three steps of two prompts x four sessions. Its ``rollout_func`` gets the groups from a
real ``polar serve`` over vLLM's CPU build; its callback loads each step's weights into vLLM in place, so the policy
version advances 1 -> 2 -> 3 -> 4; every trace carries the version that sampled it; ``polar verify --recompute``
passes on every step, in the loop and from the command line against each version's checkpoint.

The model is tiny_agent's cached build (.ci/setup_tiny_agent.sh; built here when missing). Without the vLLM venv the
test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import hashlib
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
PHASES = {"sampling", "training", "weight_loading", "verify"}
STEPS, PROMPTS, GENERATIONS = 3, 2, 4


def digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_trl_grpo_trains_three_steps_the_versions_advance_and_every_step_verifies(tmp_path: Path) -> None:
    python = require_vllm_python()
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "POLAR_VLLM_VENV": str(python.parent.parent),
           "TRL_EXPERIMENTAL_SILENCE": "1"}  # fmt: skip
    argv = ["bash", str(ROOT / "examples" / "trl_grpo" / "run.sh"), "--steps", str(STEPS), "--prompts-per-step",
            str(PROMPTS), "--num-generations", str(GENERATIONS), "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert [(s["policy_version"], s["new_policy_version"]) for s in steps] == [(1, 2), (2, 3), (3, 4)]
    checkpoints = {s["policy_version"]: Path(s["sampled_with"]) for s in steps}
    checkpoints |= {s["new_policy_version"]: Path(s["checkpoint"]) for s in steps}

    merged = tmp_path / "all-steps.jsonl"
    rows = []
    for s in steps:
        assert s["groups"] == PROMPTS and s["sessions"] == PROMPTS * GENERATIONS, s
        assert s["tokens_trained"] > 0 and set(s["seconds"]) == PHASES, s
        assert s["verify_ok"] and s["verify_mean_abs_dlogprob"] < TOLERANCE, s
        lines = (out / f"step-{s['step']}" / "results.jsonl").read_text().splitlines()
        results = [SessionResult.model_validate_json(line) for line in lines]
        assert len(results) == PROMPTS * GENERATIONS and all(r.reward is not None for r in results)
        for trace in (t for r in results for t in r.trajectory.traces):  # the version that sampled it
            versions = trace.policy_versions
            assert versions is not None and versions.oldest == versions.newest == s["policy_version"], versions
        # TRL's optimizer moved the weights at every step that had something to learn: a group whose rewards differ.
        # A step whose groups all have equal rewards has zero advantages (GRPO), and at step 0 (no optimizer state
        # yet) it leaves the weights as they are; seen in CI when all 8 sessions of step 0 succeeded.
        rewards: dict[str, set[float | None]] = {}
        for r in results:
            rewards.setdefault(r.task_id, set()).add(r.reward)
        if any(len(group) > 1 for group in rewards.values()):
            old, new = checkpoints[s["policy_version"]], checkpoints[s["new_policy_version"]]
            assert digest(old) != digest(new), (s["step"], rewards)
        rows += lines
    merged.write_text("\n".join(rows) + "\n")
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the command line agrees: every step's traces against the checkpoint of the version that sampled them
    models = [arg for version in (1, 2, 3) for arg in ("--model", f"{version}={checkpoints[version]}")]
    argv = [sys.executable, "-m", "polar_cli", "verify", str(merged), "--recompute", *models,
            "--journal", str(out / "polar-data" / "journal"), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"] and report["mean_abs_dlogprob"] < TOLERANCE, report
    assert report["structural"]["checked"] == report["traces"] >= STEPS * PROMPTS * GENERATIONS
