"""Polar's veRL agent loop inside veRL (0.9.1, the venv of .ci/setup_verl.sh), against a real ``polar serve`` on a real
vLLM CPU server: veRL's agent-loop worker, built from veRL's own trainer config and server-manager objects (its load
balancer holding the vLLM server as its replica), finds the loop in its registry by name and generates two batches
(tests/trainers/verl_driver.py, run in veRL's venv); between them, veRL's weight sync through
``PolarCheckpointEngineManager`` bumps Polar's policy version.

The sync runs veRL's ``naive`` path with stand-ins for the trainer's actor worker group, which has no weights to push
(training is not what is tested), and for veRL's vLLM replica (its module needs vLLM in veRL's venv), which gives the
manager its server's address: what is checked is that Polar samples under the step's version after the sync (it
pauses before it and resumes after) and that the vLLM server's own weight version is the step's, with no reload.
Without the veRL or vLLM venv the test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from polar_cli.client import AsyncPolarClient
from polar_cli.proxy.journal import read_journal
from tests.server.procs import Serve, serve_config
from tests.support.vllm import MODEL_NAME, vllm_model_dir, vllm_url

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_model_dir", "vllm_url"]

ROOT = Path(__file__).resolve().parents[2]
STEP = 7
# The harness: one short chat call through the session's proxy.
AGENT = """
import json, os, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
body = {"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}],
        "max_tokens": 8, "temperature": 1.0}
request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
json.load(urllib.request.urlopen(request, timeout=300))
print("done")
"""
TASK = {
    "instruction": "Say something.",
    "timeout_seconds": 300,
    "agent": {"harness": "shell", "config": {"command": f'exec {sys.executable} "$HOME/agent.py"',
                                             "files": {"agent.py": AGENT}}},
    "builder": {"strategy": "prefix_merging"},
}  # fmt: skip


def verl_python() -> Path:
    venv = Path(os.environ.get("POLAR_VERL_VENV") or Path.home() / ".cache" / "polar" / "verl-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        reason = "the veRL venv is missing: run .ci/setup_verl.sh (or set POLAR_VERL_VENV)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; in CI this is an error, not a skip")
        pytest.skip(reason)
    return python


def test_verl_worker_runs_polars_agent_loop_by_name_and_a_weight_sync_reaches_the_completions(
    vllm_url: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    python = verl_python()
    data_dir = tmp_path / "polar-data"
    serve = Serve(data_dir, "--port", "0", "--config", str(serve_config(tmp_path, "serve")), "--backend", "vllm",
                  "--backend-url", vllm_url, "--model", MODEL_NAME)  # fmt: skip
    try:
        info = asyncio.run(serve.ready())
        env = {**os.environ, "POLAR_SERVER": info["url"], "POLAR_TOKEN": info["token"], "PYTHONPATH": str(ROOT),
               "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
        address = urlsplit(vllm_url).netloc
        argv = [str(python), str(ROOT / "tests" / "trainers" / "verl_driver.py"), address, str(vllm_model_dir),
                json.dumps(TASK), str(STEP)]  # fmt: skip
        ran = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
        out = json.loads(ran.stdout.strip().splitlines()[-1])
        asyncio.run(check(out, info, data_dir, vllm_url))
        # the sync set the vLLM server's own weight version too (no reload)
        assert httpx.get(f"{vllm_url}/weight_info", timeout=10).json()["weight_version"] == str(STEP)
    finally:
        serve.stop()
        # the server is shared by the run's vLLM tests: its version back as it started
        httpx.post(f"{vllm_url}/update_weight_version", json={"new_version": "default"}, timeout=10)


async def check(out: dict[str, Any], info: dict[str, Any], data_dir: Path, vllm_url: str) -> None:
    assert out["registered"] == out["loop"] == "polar_cli.trainers.verl_loop.PolarAgentLoop"
    assert {"prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores"} <= set(out["keys"])
    async with AsyncPolarClient(info["url"], info["token"]) as client:
        [gateway] = (await client.inference()).gateways
        assert gateway.pool is not None and [r.url for r in gateway.pool.replicas] == [vllm_url]
        assert (await client.inference()).policy_version == STEP
        for batch, version in (("first", 1), ("second", STEP)):
            rows = out[batch]
            assert len(rows) == 4
            # the two samples of each prompt: one Polar task with two samples, each session returned once
            by_task: dict[str, set[tuple[str, int]]] = {}
            for row in rows:
                polar = row["extra_fields"]["polar"]
                assert polar["task_id"] == f"verl-{row['uid']}"
                by_task.setdefault(polar["task_id"], set()).add((polar["session_id"], polar["sample_index"]))
                assert row["response_ids"] and 1 in row["response_mask"]
                assert len(row["response_logprobs"]) == len(row["response_ids"])
            assert sorted(len(v) for v in by_task.values()) == [2, 2]
            assert all({i for _, i in v} == {0, 1} for v in by_task.values())
            for task_id in by_task:
                status = await client.status(task_id)
                assert status.state == "completed" and status.num_samples == 2
                for sid in status.sessions:
                    calls = read_journal(data_dir / "journal" / f"{sid}.jsonl")
                    assert len(calls) == 1
                    assert {c.policy_version for c in calls} == {version} and {c.replica for c in calls} == {vllm_url}
