"""Multi-turn fidelity on real sampling (issue 22): vLLM's CPU build serves the tiny tool-calling model that
``examples/tiny_agent`` makes from Polar's own data, and real CLIs over three protocols (pi on Chat Completions, codex
on Responses, claude_code on Messages) run several sessions each through ``polar run``, at temperature 0.5. The model
reasons (``<think>``, read by vLLM's reasoning parser), makes its harness's shell-tool call, gets the tool result and
ends its turn, so every session makes at least two model calls.

Checked on every session: ``verify`` passes against the session's journal; independently of the builder, the main
trace is the journal's completions laid out as ``p_1 ‖ a_1 ‖ u_1 ‖ a_2 ‖ ...``: each ``a_m`` the completion's sampled
ids and logprobs under mask 1, each interstitial ``u_m`` the next prompt's ids under mask 0; each completion's prompt
ids equal vLLM's own ``/tokenize`` of the messages it was sent; and the main chain holds every turn, unless the
prefix really broke, and then the break's cause is recorded. The log shows turns per session and merged chain lengths.

The model is built once from the repository (``.ci/setup_tiny_agent.sh``, cached under ~/.cache/polar/tiny-agent by a
hash of its inputs), never downloaded; a missing model is built here. Without the vLLM venv or the CLIs the test skips,
except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from polar_cli.builders import verify
from polar_cli.models import Completion, SessionResult, Trace
from polar_cli.proxy.journal import read_journal
from polar_cli.registry import LOAD_ENV, get_harness
from tests.support.vllm import MODEL_NAME, VllmServer, require_vllm_python, tokenize_messages

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "tiny_agent"))
import tiny_agent  # noqa: E402

HARNESSES = ("pi", "codex", "claude_code")
SAMPLES = 3
# below 1 so that a stray sample (about one session in ten at temperature 1 answers without the tool) does not fail
# the "at least two model calls" check; the recorded logprobs are the model's raw ones either way
TEMPERATURE = 0.5
PLUGINS = "codex,claude-code"  # the plugin packages of codex and claude_code, and no stray installed plugin
END_OF_TURN = 2  # the demo tokenizer's <|im_end|>



def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@dataclass
class Session:
    harness: str
    result: SessionResult
    journal: list[Completion]


@pytest.fixture(scope="module")
def tiny_agent_model() -> Path:
    """The model folder: the cached build (built when missing) or ``POLAR_TINY_AGENT_MODEL``."""
    require_vllm_python()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOAD_ENV, PLUGINS)
        missing = [h for h in (*HARNESSES, "shell") if not get_harness(h).is_installed()]
        if missing:
            reason = f"CLIs not installed: {missing} (polar harness install ...)"
            pytest.fail(reason) if in_ci() else pytest.skip(reason)
        # POLAR_TINY_AGENT_MODEL: another build of the model (examples/tiny_agent/run.sh --out DIR: DIR/model)
        override = os.environ.get("POLAR_TINY_AGENT_MODEL")
        return Path(override) if override else tiny_agent.cached_model()


@pytest.fixture(scope="module")
def tiny_agent_url(tiny_agent_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("tiny-agent-vllm") / "vllm.log"
    server = VllmServer(tiny_agent_model, log, max_model_len=tiny_agent.MAX_MODEL_LEN,
                        extra_args=["--reasoning-parser", tiny_agent.REASONING_PARSER])  # fmt: skip
    server.start()
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sessions(tiny_agent_url: str, tmp_path_factory: pytest.TempPathFactory) -> list[Session]:
    """``polar run`` of the first training task, SAMPLES sessions per harness, at TEMPERATURE."""
    out: list[Session] = []
    file, line = tiny_agent.TASKS[0]
    for harness in HARNESSES:
        work = tmp_path_factory.mktemp(f"tiny-agent-{harness}")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(LOAD_ENV, PLUGINS)
            spec = tiny_agent.eval_task(harness, file, line, max_tokens=256, temperature=TEMPERATURE)
        (work / "task.json").write_text(spec)
        env = {**os.environ, LOAD_ENV: PLUGINS}
        argv = [sys.executable, "-m", "polar_cli", "run", "task.json", "--backend", "vllm", "--backend-url",
                tiny_agent_url, "--model", MODEL_NAME, "--samples", str(SAMPLES), "--out", "results.jsonl",
                "--no-install"]  # fmt: skip
        run = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        lines = (work / "results.jsonl").read_text().splitlines() if (work / "results.jsonl").exists() else []
        assert len(lines) == SAMPLES, run.stdout[-3000:] + run.stderr[-3000:]
        for text in lines:
            result = SessionResult.model_validate_json(text)
            path = work / "polar-data" / "journal" / f"{result.session_id}.jsonl"
            out.append(Session(harness, result, read_journal(path) if path.exists() else []))
    return out


def main_trace(session: Session) -> Trace:
    mains = [t for t in session.result.trajectory.traces if t.role == "main"]
    assert len(mains) >= 1, session.result.trajectory.metadata
    return mains[0]


def check_layout(trace: Trace, journal: list[Completion]) -> None:
    """The trace is ``p_1 ‖ a_1 ‖ u_1 ‖ ... ‖ a_K`` over its completions, rebuilt here from the journal alone."""
    by_id = {c.completion_id: c for c in journal}
    ids = trace.metadata.get("completion_ids") or [trace.metadata["completion_id"]]
    chain = [by_id[i] for i in ids]
    assert trace.prompt_ids == chain[0].prompt_ids
    response = trace.response_ids
    mask = trace.loss_mask
    logprobs = [entry["logprob"] for entry in trace.response_logprobs or []]
    pos = 0
    for m, completion in enumerate(chain):
        n = len(completion.response_ids)
        assert response[pos : pos + n] == completion.response_ids, f"a_{m + 1} is not what completion {m} sampled"
        assert mask[pos : pos + n] == [1] * n, f"a_{m + 1} is not all mask 1"
        assert completion.response_logprobs is not None and logprobs[pos : pos + n] == completion.response_logprobs
        pos += n
        if m + 1 == len(chain):
            break
        prompt, nxt = completion.prompt_ids, chain[m + 1].prompt_ids
        assert nxt[: len(prompt)] == prompt, f"completion {m + 1}'s prompt does not extend completion {m}'s"
        closed = completion.response_ids[-1:] == [END_OF_TURN]
        if nxt[len(prompt) : len(prompt) + n] == completion.response_ids:  # the sampled ids, as merge: exact needs
            start = len(prompt) + n
        else:  # merge: prompt_prefix, the turn re-rendered: after the end-of-turn token that closes it
            start = nxt.index(END_OF_TURN, len(prompt)) + 1 if closed else len(prompt)
        interstitial = nxt[start:]
        assert response[pos : pos + len(interstitial)] == interstitial, f"u_{m + 1} is not the next prompt's tail"
        assert mask[pos : pos + len(interstitial)] == [0] * len(interstitial), f"u_{m + 1} is not all mask 0"
        pos += len(interstitial)
    assert pos == len(response)


def test_real_clis_make_multi_turn_sessions_with_faithful_traces(
    sessions: list[Session], tiny_agent_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["tiny agent on vLLM: harness, session, model calls, chains, main chain length, trainable / masked "
             "tokens, tokens to train on per_request -> prefix_merging, reward"]  # fmt: skip
    for session in sessions:
        result, journal = session.result, session.journal
        meta = result.trajectory.metadata
        trace = main_trace(session)
        main_length = len(trace.metadata.get("completion_ids") or [1])
        per_request = sum(len(c.prompt_ids) + len(c.response_ids) for c in journal)
        merged = sum(len(t.prompt_ids) + len(t.response_ids) for t in result.trajectory.traces)
        masked = len(trace.loss_mask) - sum(trace.loss_mask)
        lines.append(f"  {session.harness:12s} {result.session_id[:12]}  calls {len(journal)}  chains "
                     f"{meta.get('chains')}  main chain {main_length}  tokens {sum(trace.loss_mask)} / {masked}  "
                     f"tokens {per_request} -> {merged}  reward {result.reward}")  # fmt: skip
    with capsys.disabled():  # into the CI log, with or without -s
        print("\n" + "\n".join(lines))
    for session in sessions:
        result, journal = session.result, session.journal
        assert result.num_completions == len(journal) >= 2, (session.harness, result.error, len(journal))
        assert all(c.backend == "vllm" and c.token_source == "backend" for c in journal)
        report = verify(result.trajectory, journal)
        assert report.ok, report.summary()
        assert report.placed_completions == len(journal)
        for trace in result.trajectory.traces:
            check_layout(trace, journal)
        with httpx.Client(timeout=120) as client:
            for completion in journal:
                body = {"model": MODEL_NAME, "messages": tokenize_messages(completion), "add_generation_prompt": True}
                if completion.request_tools:
                    body["tools"] = completion.request_tools
                tokens = client.post(f"{tiny_agent_url}/tokenize", json=body).json()["tokens"]
                assert tokens == completion.prompt_ids, f"{session.harness}: /tokenize differs from the prompt ids"
        meta = result.trajectory.metadata
        main_length = len(main_trace(session).metadata.get("completion_ids") or [1])
        if main_length < len(journal):  # the prefix broke: every later chain says why
            causes = [b["cause"] for b in meta["breaks"]]
            assert len(causes) == meta["chains"] - 1 and all(causes), meta


def test_the_model_was_trained_on_the_ids_its_server_makes_and_passed_its_gate(
    tiny_agent_model: Path, tiny_agent_url: str
) -> None:
    """The build's teacher sessions are, token for token, what vLLM serving the model makes of the same text: they
    were tokenized with the served model's tokenizer, not the demo tokenizer's folder, which merges digits where the
    model's splits them (a model trained on those ids saw a date as it is never served, and at temperature 0.5 one
    such build answered every claude_code session with the same malformed tool call). The build's windows were the
    same for every session of a task, and the model passed its gate."""
    build = tiny_agent_model.parent
    if not (build / "dataset").is_dir():
        pytest.skip(f"no build next to {tiny_agent_model} (DIR/dataset, DIR/summary.json of run.sh --out DIR)")
    firsts = {t.task_id.split("-")[1]: t for t in tiny_agent.turns(build / "dataset") if t.index == 0}
    assert sorted(firsts) == sorted(tiny_agent.HARNESSES)
    tokenizer = AutoTokenizer.from_pretrained(tiny_agent_model)
    with httpx.Client(timeout=120) as client:
        for harness, turn in firsts.items():
            prompt = turn.ids[: turn.start]
            body = {"model": MODEL_NAME, "prompt": tokenizer.decode(prompt), "add_special_tokens": False}
            tokens = client.post(f"{tiny_agent_url}/tokenize", json=body).json()["tokens"]
            assert tokens == prompt, f"{harness}: the teacher's prompt is not tokenized as the server tokenizes it"
    summary = json.loads((build / "summary.json").read_text())
    assert summary["varying_turns"] == [], summary
    assert summary["gate"][-1]["min_turn_probability"] >= tiny_agent.parse_args([]).gate_min, summary["gate"]
