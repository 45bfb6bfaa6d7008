"""``polar verify`` and ``polar_cli.recompute`` without an inference server: traces whose logprobs a transformers copy
of the demo model sampled, two checkpoints (seeds) of it for policy versions, each input kind, and bad input.

(test_verify_vllm.py does the same against traces a real vLLM server sampled.)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_cli.demo_model import build_demo_model
from polar_cli.generate.ledger import Ledger, ResultRow
from polar_cli.models import Completion, PolicyVersions, SessionResult, TaskRequest, Trace, Trajectory
from polar_cli.models.inference import VersionSpan
from polar_cli.recompute import LoadedTrace, load_traces, recompute, token_versions
from polar_cli.recompute.logprobs import TOLERANCES, CausalLM

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [5, 17, 99, 300, 41, 7]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo model (seed 1234) and another checkpoint of it (seed 7)."""
    base = tmp_path_factory.mktemp("models")
    return {"a": build_demo_model(base / "a", seed=1234), "b": build_demo_model(base / "b", seed=7)}


def sample(model_dirs: list[Path], n: int, seed: int, prompt: list[int] = PROMPT) -> tuple[list[int], list[float]]:
    """``n`` tokens sampled after ``prompt`` at temperature 1, token ``i`` from ``model_dirs[i * len // n]``, with the
    logprob that model gave it (what an inference server records)."""
    from transformers import AutoModelForCausalLM

    loaded = [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in model_dirs]
    generator = torch.Generator().manual_seed(seed)
    ids, logprobs = list(prompt), []
    with torch.inference_mode():
        for i in range(n):
            model = loaded[i * len(loaded) // n]
            scores = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            token = int(torch.multinomial(scores.exp(), 1, generator=generator))
            ids.append(token)
            logprobs.append(float(scores[token]))
    return ids[len(prompt) :], logprobs


def make_trace(ids: list[int], logprobs: list[float], **fields: Any) -> Trace:
    entries = [{"token": None, "token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)]
    return Trace(prompt_ids=PROMPT, response_ids=ids, loss_mask=[1] * len(ids), response_logprobs=entries,
                 metadata={"harness": "shell"}, **fields)  # fmt: skip


def results_file(path: Path, traces: list[Trace], session: str = "s1") -> Path:
    result = SessionResult(session_id=session, task_id="t1", status="completed",
                           trajectory=Trajectory(status="completed", traces=traces))  # fmt: skip
    path.write_text(result.model_dump_json() + "\n")
    return path


def polar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def two_versions(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One trace whose first 8 tokens version 1 (model a) sampled and the next 8 version 2 (model b)."""
    ids, logprobs = sample([models["a"], models["b"]], 16, seed=1)
    versions = PolicyVersions(oldest=1, newest=2, per_completion=[1],
                              spans=[VersionSpan(start=0, version=1), VersionSpan(start=8, version=2)])  # fmt: skip
    folder = tmp_path_factory.mktemp("two-versions")
    return results_file(folder / "results.jsonl", [make_trace(ids, logprobs, policy_versions=versions)])


def test_version_mapping_recomputes_each_span_with_its_model(two_versions: Path, models: dict[str, Path]) -> None:
    done = polar("verify", str(two_versions), "--recompute", "--model", f"1={models['a']}", "--model",
                 f"2={models['b']}", "--json", "--device", "cpu", "--chunk-size", "5")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["tokens"] == 16
    assert report["max_abs_dlogprob"] < 1e-5
    assert set(report["by_version"]) == {"1", "2"} and report["by_version"]["2"]["tokens"] == 8
    # 6 prompt tokens: model a runs up to response token 7 (13 tokens), model b up to 15 (21), 5 tokens a pass
    assert report["compute"] | {"seconds": 0, "tokens_per_second": 0} == {
        "device": "cpu", "dtype": "float32", "chunk_size": 5, "forward_tokens": 34, "seconds": 0,
        "tokens_per_second": 0, "peak_gpu_memory_gib": None}  # fmt: skip


@pytest.mark.parametrize("window", [None, 16], ids=["full-attention", "sliding-window"])
def test_chunked_prefill_gives_the_logprobs_of_one_pass(
    window: int | None, models: dict[str, Path], tmp_path: Path
) -> None:
    """The KV cache carries each chunk's context into the next: the same logprobs as one pass, for chunk sizes that
    cut the prompt, the scored run and a sliding window (the tiny agent's attention) anywhere, positions in any
    order."""
    folder = models["a"]
    if window is not None:
        folder = tmp_path / "sliding"
        shutil.copytree(models["a"], folder)
        config = json.loads((folder / "config.json").read_text())
        config.update(use_sliding_window=True, sliding_window=window, max_window_layers=0,
                      layer_types=["sliding_attention"] * config["num_hidden_layers"])  # fmt: skip
        (folder / "config.json").write_text(json.dumps(config))
    rng = random.Random(window)
    ids = [rng.randrange(2000) for _ in range(200)]
    positions = [*range(150, 200), *range(60, 90), 1, 37]
    whole = CausalLM(folder, "float32", "cpu", chunk_size=0)
    expected = whole.logprobs(ids, positions)
    for chunk in (1, 7, 64, 200):
        got = CausalLM(folder, "float32", "cpu", chunk_size=chunk).logprobs(ids, positions)
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-5, chunk
    assert whole.logprobs(ids, positions[:3]) == pytest.approx(expected[:3], abs=1e-5)
    assert whole.logprobs(ids, []) == []


def test_each_dtype_has_its_own_default_tolerance(models: dict[str, Path]) -> None:
    ids, logprobs = sample([models["a"]], 24, seed=8)
    loaded = LoadedTrace(ref="session s trace 0", session_id="s", trace=make_trace(ids, logprobs))
    for dtype in ("float32", "bfloat16", "float16"):
        report = recompute([loaded], {None: models["a"]}, dtype=dtype, device="cpu")
        assert report.ok and report.tolerance == TOLERANCES[dtype] and report.compute.dtype == dtype
    assert recompute([loaded], {None: models["a"]}, dtype="bfloat16", tolerance=1e-9).failed == [loaded.ref]


def test_one_model_for_two_versions_fails_naming_the_trace(two_versions: Path, models: dict[str, Path]) -> None:
    done = polar("verify", str(two_versions), "--recompute", "--model", str(models["a"]))
    assert done.returncode == 1
    assert "FAILED: 1 trace(s) failed, worst session s1 trace 0 of task t1" in done.stdout


def test_a_version_without_a_model_is_bad_input_naming_it(two_versions: Path, models: dict[str, Path]) -> None:
    done = polar("verify", str(two_versions), "--recompute", "--model", f"1={models['a']}")
    assert done.returncode == 2
    assert "session s1 trace 0 of task t1 has tokens sampled under policy version 2" in done.stderr


def test_token_versions_follow_the_spans() -> None:
    def versions(spans: list[tuple[int | None, int]], n: int = 6) -> list[object]:
        pv = PolicyVersions(oldest=1, newest=3, per_completion=[1],
                            spans=[VersionSpan(start=s, version=v) for s, v in spans])  # fmt: skip
        return token_versions(Trace(prompt_ids=[1], response_ids=[2] * n, loss_mask=[1] * n, policy_versions=pv))

    assert versions([(0, 1), (4, 2)]) == [1, 1, 1, 1, 2, 2]
    assert versions([(0, 1), (None, 2), (3, 3)]) == [(1, 2)] * 3 + [3] * 3
    assert versions([(0, 1), (None, 2)]) == [(1, 2)] * 6
    plain = Trace(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1])
    assert token_versions(plain) == [None, None]


def test_a_trace_whose_logprobs_belong_to_other_tokens_fails_by_name(models: dict[str, Path], tmp_path: Path) -> None:
    ids, logprobs = sample([models["a"]], 12, seed=2)
    good = make_trace(ids, logprobs)
    bad = good.model_dump()
    bad["response_ids"] = [*ids[:5], (ids[5] + 1) % 3000, *ids[6:]]  # an id changed, its logprob entry not
    trajectory = Trajectory(status="completed", traces=[good])
    result = SessionResult(session_id="s2", status="completed", trajectory=trajectory)
    data = json.loads(result.model_dump_json())
    data["trajectory"]["traces"].append(bad)
    (tmp_path / "results.jsonl").write_text(json.dumps(data) + "\n")
    done = polar("verify", str(tmp_path / "results.jsonl"), "--recompute", "--model", str(models["a"]), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["failed"] == ["session s2 trace 1"]
    assert "response_logprobs[5].token_id" in report["worst"][0]["reason"]
    assert report["traces"] == 1 and report["max_abs_dlogprob"] < 1e-5  # the good one is still measured


def test_a_failing_trace_built_with_prompt_prefix_says_its_context_is_not_exact(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """Turn 2 was sampled after the template's re-rendering of turn 1 (one token changed); a trace that keeps turn 1's
    sampled ids before it (the paper's rule) scores turn 2 in a context it was not sampled in. The failure says the
    trace said so."""
    a1, lp1 = sample([models["a"]], 6, seed=6)
    rerendered = [*a1[:2], (a1[2] + 1) % 3000, *a1[3:]]
    between = [41, 7]
    a2, lp2 = sample([models["a"]], 12, seed=7, prompt=[*PROMPT, *rerendered, *between])
    ids = [*a1, *between, *a2]
    entries = [{"token": None, "token_id": t, "logprob": lp} for t, lp in zip(ids, [*lp1, 0.0, 0.0, *lp2], strict=True)]
    drifted = Trace(prompt_ids=PROMPT, response_ids=ids, loss_mask=[1] * 6 + [0, 0] + [1] * 12,
                    response_logprobs=entries, metadata={"harness": "shell"}, context_exact=False)  # fmt: skip
    done = polar("verify", str(results_file(tmp_path / "r.jsonl", [drifted])), "--recompute", "--model",
                 str(models["a"]), "--json")  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert report["failed"] == report["failed_context_inexact"] == ["session s1 trace 0 of task t1"]
    assert report["worst"][0]["context_exact"] is False and "context_exact: false" in report["worst"][0]["reason"]
    text = polar("verify", str(tmp_path / "r.jsonl"), "--recompute", "--model", str(models["a"]))
    assert text.returncode == 1
    assert "1 of them say context_exact: false: built with the builder's merge: prompt_prefix" in text.stdout


def generated(folder: Path, trace: Trace, completions: list[Completion] | None = None) -> Path:
    """A ``polar generate`` folder with one session holding ``trace`` (and its journal when ``completions``)."""
    result = SessionResult(session_id="g1", task_id="t0", status="completed", reward=1.0, num_completions=1,
                           trajectory=Trajectory(status="completed", traces=[trace]))  # fmt: skip
    with Ledger(folder) as ledger:
        ledger.remember_task(0, "r", TaskRequest(task_id="t0", instruction="x", agent={"harness": "shell"}))
        ledger.finish(ResultRow("t0", 0, "g1", "r", 1, "completed", 1.0, True, 1, 3, 1, 1), result)
    if completions is not None:
        (folder / "service" / "journal").mkdir(parents=True)
        lines = "".join(c.model_dump_json() + "\n" for c in completions)
        (folder / "service" / "journal" / "g1.jsonl").write_text(lines)
    return folder


def completion(trace: Trace, **fields: Any) -> Completion:
    return Completion(completion_id="c0", session_id="g1", index=0, provider="openai_chat", model="m", request={},
                      request_messages=[], response_message={"role": "assistant", "content": ""},
                      prompt_ids=trace.prompt_ids, response_ids=trace.response_ids,
                      response_logprobs=[e["logprob"] for e in trace.response_logprobs or []],
                      started_at=0.0, finished_at=1.0, **fields)  # fmt: skip


def test_each_input_kind_loads(models: dict[str, Path], tmp_path: Path) -> None:
    ids, logprobs = sample([models["a"]], 10, seed=3)
    trace = make_trace(ids, logprobs)
    folder = generated(tmp_path / "gen", trace, [completion(trace)])
    [from_generate] = load_traces(folder)
    assert from_generate.ref == "session g1 trace 0 of task t0" and from_generate.completions is not None
    assert from_generate.harness == "shell" and from_generate.trace.response_ids == ids
    done = polar("export", str(folder), "--to", str(tmp_path / "dataset"))
    assert done.returncode == 0, done.stderr
    [from_dataset] = load_traces(tmp_path / "dataset")
    assert from_dataset.ref == from_generate.ref and from_dataset.completions is None
    assert from_dataset.trace.response_logprobs == trace.response_logprobs
    [from_results] = load_traces(results_file(tmp_path / "r.jsonl", [trace]), journal=folder / "service" / "journal")
    assert from_results.session_id == "s1" and from_results.completions is None  # no journal of session s1 there
    for path in (folder, tmp_path / "dataset", tmp_path / "r.jsonl"):
        done = polar("verify", str(path), "--recompute", "--model", str(models["a"]))
        assert done.returncode == 0, done.stdout + done.stderr
    structural = polar("verify", str(folder), "--json")
    assert structural.returncode == 0 and json.loads(structural.stdout)["structural"]["checked"] == 1


def test_processed_logprobs_at_a_temperature_are_warned_about(models: dict[str, Path]) -> None:
    ids, logprobs = sample([models["a"]], 6, seed=4)
    trace = make_trace(ids, logprobs)
    done = completion(trace, logprobs_mode="processed", request_params={"temperature": 0.7})
    loaded = LoadedTrace(ref="session g1 trace 0", session_id="g1", trace=trace, completions=[done])
    report = recompute([loaded], {None: models["a"]})
    assert report.ok and report.structural.checked == 1
    assert any("processed logprobs" in w and "temperature 0.7" in w for w in report.warnings)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.jsonl"], "missing.jsonl: no such file or folder"),
        (["{results}", "--recompute"], "--recompute needs --model"),
        (["{results}", "--model", "{model}"], "--model is for --recompute"),
        (["{results}", "--recompute", "--model", "x=/tmp"], "VERSION=DIR needs a whole-number policy version"),
        (["{results}", "--recompute", "--model", "1="], "no folder after '='"),
        (["{results}", "--recompute", "--model", "{empty}"], "no config.json there"),
        (["{results}", "--recompute", "--model", "{noweights}"], "no weights there"),
        (["{results}", "--recompute", "--model", "{model}", "--dtype", "int8"], "--dtype 'int8'"),
        (["{results}", "--recompute", "--model", "{model}", "--device", "tpu"], "--device 'tpu': one of auto, cpu"),
        (["{results}", "--recompute", "--model", "{model}", "--device", "cpu:1"], "--device 'cpu:1': one of"),
        pytest.param(
            ["{results}", "--recompute", "--model", "{model}", "--device", "cuda:0"],
            "--device cuda:0: torch sees no GPU",
            id="cuda-without-a-gpu",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there"),
        ),
        (["{empty}"], "none of a polar generate folder"),
        (["{results}"], "no journal of completions for any of its 1 session(s)"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    args: list[str], message: str, models: dict[str, Path], tmp_path: Path
) -> None:
    ids, logprobs = sample([models["a"]], 3, seed=5)
    paths = {"results": results_file(tmp_path / "r.jsonl", [make_trace(ids, logprobs)]), "model": models["a"],
             "empty": tmp_path / "empty", "noweights": tmp_path / "noweights"}  # fmt: skip
    paths["empty"].mkdir()
    paths["noweights"].mkdir()
    (paths["noweights"] / "config.json").write_text("{}")
    done = polar("verify", *(a.format(**paths) for a in args))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_without_torch_the_error_names_the_extra(models: dict[str, Path], tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nfrom importlib.abc import MetaPathFinder\n"
        "class NoTorch(MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
    )
    ids, logprobs = sample([models["a"]], 3, seed=6)
    path = results_file(tmp_path / "r.jsonl", [make_trace(ids, logprobs)])
    assert polar("verify", "--help", env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}).returncode == 0
    done = polar("verify", str(path), "--recompute", "--model", str(models["a"]),
                 env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})  # fmt: skip
    assert done.returncode == 2 and "needs torch: pip install 'polar-rl[train]'" in done.stderr, done.stderr


def test_scripted_backend_traces_are_skipped_as_synthetic(models: dict[str, Path], tmp_path: Path) -> None:
    """A real ``polar run`` (the shell harness's agent, the scripted backend): its journal says the scripted backend
    sampled the session, whose logprobs are synthetic; --recompute skips its trace saying so, instead of failing it
    on a Δ no model could explain."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "polar_cli", "run", str(ROOT / "examples" / "shell-agent.yaml"),
                          "--script", str(ROOT / "examples" / "scripts" / "two-turns.yaml"), "--out", "results.jsonl"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    results = tmp_path / "results.jsonl"
    [loaded] = load_traces(results)
    assert loaded.completions and {c.backend for c in loaded.completions} == {"scripted"}
    done = polar("verify", str(results), "--recompute", "--model", str(models["a"]), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["ok"] and report["scripted"] == 1 and report["traces"] == 0 and report["failed"] == []
    assert report["skipped"] == [f"{loaded.ref}: sampled by the scripted backend, whose logprobs are synthetic (a "
                                 "deterministic stand-in, not any model's): they cannot be recomputed, so the trace is "
                                 "skipped"]  # fmt: skip
    assert report["structural"]["checked"] == 1 and report["structural"]["ok"]
    text = polar("verify", str(results), "--recompute", "--model", str(models["a"]))
    assert text.returncode == 0
    assert "note: " + report["skipped"][0] in " ".join(text.stderr.split())
    assert text.stdout.strip().endswith(
        "ok (1 trace(s) sampled by the scripted backend not recomputed: its logprobs are synthetic, no model's)"
    )
