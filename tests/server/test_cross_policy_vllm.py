"""Cross-policy sampling on two real vLLM CPU servers behind one real ``polar serve``: A current, B stale
(``proxy.pool.stale_replicas``), ``stale_period`` 2. The first ``load_weights`` reloads A only, so a task with
``agent.sampling.stale_fraction`` 0.5 samples from version 2 on A and version 1 on B, each call drawn at random; the
second load reloads both (version 3). ``polar verify --recompute --model V=DIR`` passes every trace against the
weights of the version it recorded. Two more loads of the original weights put the servers back.

The servers are the run's shared pair (tests/support/vllm.py). Without the vLLM venv the test skips, except in CI.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from safetensors.numpy import load_file, save_file

from polar_cli.client import AsyncPolarClient
from polar_cli.models import SessionResult
from polar_cli.proxy.journal import read_journal
from tests.support.vllm import MODEL_NAME, VllmServer, vllm_model_dir, vllm_pair, write_demo_model

from .procs import Serve, serve_config

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_model_dir", "vllm_pair"]

ROOT = Path(__file__).resolve().parents[2]
FRACTION = 0.5
TOLERANCE = 1e-3

# CALLS short chat calls through the session's proxy, each with the history so far (one trace per call: per_request)
AGENT = """
import json, os, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
for turn in range(int(os.environ["CALLS"])):
    body = {"model": os.environ["POLAR_MODEL"], "messages": messages, "max_tokens": 6, "temperature": 1.0}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    answer = json.load(urllib.request.urlopen(request, timeout=300))
    messages += [{"role": "assistant", "content": answer["choices"][0]["message"].get("content") or ""},
                 {"role": "user", "content": "go on"}]
"""


def task(task_id: str, samples: int, calls: int) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": f"Say something about {task_id}.",
        "num_samples": samples,
        "timeout_seconds": 300,
        "agent": {
            "harness": "shell",
            "model_name": MODEL_NAME,
            "env": {"CALLS": str(calls)},
            "sampling": {"stale_fraction": FRACTION},
            "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
        },
        "builder": {"strategy": "per_request"},
    }


async def run(client: AsyncPolarClient, task_id: str, samples: int, calls: int) -> list[SessionResult]:
    await client.submit(task(task_id, samples, calls))
    status = await client.wait(task_id, timeout=300)
    assert status.state == "completed" and len(status.results) == samples, status
    assert all(r.status == "completed" and r.error is None for r in status.results), status.results
    return status.results


def sampled_by(results: list[SessionResult], journal: Path) -> Counter[tuple[str | None, int | None]]:
    """(replica, version) of every completion of ``results``' sessions, from the gateway's journal; each session's
    traces (one per completion) carry those versions too."""
    counts: Counter[tuple[str | None, int | None]] = Counter()
    for result in results:
        completions = read_journal(journal / f"{result.session_id}.jsonl")
        traced = [t.policy_versions.per_completion if t.policy_versions else [] for t in result.trajectory.traces]
        assert [[c.policy_version] for c in completions] == traced, (completions, traced)
        counts.update((c.replica, c.policy_version) for c in completions)
    return counts


def checkpoint(folder: Path, seed: int, served: Path) -> Path:
    """The demo model with the weights of ``seed`` but the embedding of the ``served`` model: the demo model ties its
    output layer to the embedding, and vLLM's in-place reload keeps the output layer it started with (the vllm
    backend warns of it), so only checkpoints that keep it are served as saved."""
    write_demo_model(folder, seed=seed)
    weights = load_file(folder / "model.safetensors")
    weights["model.embed_tokens.weight"] = load_file(served / "model.safetensors")["model.embed_tokens.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def polar(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def test_a_stale_replica_skips_every_other_load_and_a_task_samples_both_versions_in_its_fraction(
    vllm_pair: tuple[VllmServer, VllmServer], vllm_model_dir: Path, tmp_path: Path
) -> None:
    a, b = vllm_pair
    checkpoints = {1: vllm_model_dir, 2: checkpoint(tmp_path / "seed-7", 7, vllm_model_dir),
                   3: checkpoint(tmp_path / "seed-8", 8, vllm_model_dir)}  # fmt: skip
    data_dir = tmp_path / "polar-data"
    journal = data_dir / "journal"
    pool = {"stale_replicas": [b.url], "stale_period": 2}
    topology = serve_config(tmp_path, "serve", gateway={"proxy": {"pool": pool}})
    serve = Serve(data_dir, "--port", "0", "--config", str(topology), "--backend", "vllm", "--backend-url", a.url,
                  "--backend-url", b.url, "--model", MODEL_NAME)  # fmt: skip
    results: list[SessionResult] = []

    async def body() -> None:
        info = await serve.ready()
        async with AsyncPolarClient(info["url"], info["token"], timeout=120) as client:
            try:
                await sample(info, client)
            finally:  # the shared servers go back to the original weights: the stale one takes every second load
                for version in (4, 5):
                    await client.load_weights(vllm_model_dir, version, timeout=300)

    async def sample(info: dict[str, Any], client: AsyncPolarClient) -> None:
        [gateway] = (await client.load_weights(checkpoints[2], timeout=300)).gateways
        assert gateway.pool is not None
        assert {(r.url, r.role, r.policy_version) for r in gateway.pool.replicas} == {
            (a.url, "current", 2), (b.url, "stale", 1)}  # fmt: skip
        shown = await asyncio.to_thread(polar, "inference", "status", "--server", info["url"], "--token", info["token"])
        assert shown.returncode == 0, shown.stderr
        rows = {line.split("│")[3].strip(): line for line in shown.stdout.splitlines() if "http://" in line}
        assert "current" in rows[a.url] and "stale" in rows[b.url], shown.stdout
        assert [cell.strip() for cell in rows[b.url].split("│")[4:6]] == ["stale", "1"], shown.stdout

        mixed = await run(client, "mixed", samples=4, calls=6)
        counts = sampled_by(mixed, journal)
        n = sum(counts.values())
        assert n == 24 and set(counts) == {(a.url, 2), (b.url, 1)}, counts  # each version on its replica
        assert abs(counts[b.url, 1] - n * FRACTION) <= 4 * math.sqrt(n * FRACTION * (1 - FRACTION)), counts
        results.extend(mixed)

        [gateway] = (await client.load_weights(checkpoints[3], timeout=300)).gateways  # the second load: both
        assert gateway.pool is not None
        assert {(r.url, r.policy_version) for r in gateway.pool.replicas} == {(a.url, 3), (b.url, 3)}
        caught_up = await run(client, "caught-up", samples=2, calls=3)
        assert {version for _, version in sampled_by(caught_up, journal)} == {3}
        results.extend(caught_up)

    try:
        asyncio.run(body())
    finally:
        serve.stop()
    print("sampled (replica, version):", dict(sampled_by(results, journal)))

    path = tmp_path / "results.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in results))
    models = [arg for version, folder in checkpoints.items() for arg in ("--model", f"{version}={folder}")]
    done = polar("verify", str(path), "--recompute", *models, "--journal", str(journal), "--json")
    report = json.loads(done.stdout)
    why = {k: report.get(k) for k in ("by_version", "failed", "skipped", "warnings")} | {
        "worst": report.get("worst", [])[:3],
        "structural": report.get("structural"),
        "stderr": done.stderr,
    }
    assert done.returncode == 0 and report["ok"] and report["mean_abs_dlogprob"] < TOLERANCE, why
    assert report["traces"] == 30 and report["structural"]["checked"] == 30
    print("verify:", {k: report[k] for k in ("traces", "tokens", "mean_abs_dlogprob", "max_abs_dlogprob")})
