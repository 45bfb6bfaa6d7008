"""Context-exact traces on real sampling: vLLM's CPU build serves the tuned tiny tool-calling model of
``examples/tiny_agent``, which reasons (``<think>...</think>``) before each answer, with its reasoning parser and a chat
template that rewrites the history twice over: it re-serializes earlier tool calls (``{"name":"bash"`` where the model
samples ``{"name": "bash"``) and drops earlier ``<think>`` blocks (as DeepSeek-R1's template does; Qwen3's keeps the
reasoning after the last user message, which in these one-instruction sessions is all of it). So from the second call
on, the server's rendering of the history is not what the model sampled. Real CLIs on three protocols (pi on Chat
Completions, codex on Responses, claude_code on Messages) run two-call sessions through ``polar run``, on one server:

* messages mode, default build: ``polar verify --recompute`` passes (the trace never claims a context the model did not
  see), and the chain breaks where the history was re-rendered, with its cause and where the tokens departed (at the
  sampled ``<think>``);
* tokens mode (``agent.token_mode: tokens``, ``keep_reasoning`` true by default): the proxy splices each earlier answer
  as sampled, reasoning included; an independent rebuild from the journal finds every prompt = its base's prompt + the
  base's sampled ids + the server's own rendering of the new messages, id for id; one chain per conversation;
  ``polar verify --recompute`` passes;
* tokens mode with ``keep_reasoning: false``: the prompt is the server's rendering, reasoning dropped, and the chain
  breaks with the cause ``reasoning_dropped``; ``polar verify --recompute`` passes.

Without the vLLM venv or the CLIs the tests skip, except in CI (CI=true), where they fail.
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

from polar_cli.builders import build_trajectory
from polar_cli.models import Completion, SessionResult
from polar_cli.proxy.journal import read_journal
from polar_cli.registry import LOAD_ENV, get_harness
from tests.support.vllm import MODEL_NAME, VllmServer, require_vllm_python, tokenize_messages

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "tiny_agent"))
import tiny_agent  # noqa: E402

HARNESSES = ("pi", "codex", "claude_code")
SAMPLES = 2
TEMPERATURE = 0.5
PLUGINS = "codex,claude-code"
END_OF_TURN = 2  # the demo tokenizer's <|im_end|>
# what the model was trained to sample, and the compact form this template writes into the history instead
SAMPLED_CALL = """'<tool_call>\\n{"name": ' + (fn['name'] | tojson) + ', "arguments": '"""
COMPACT_CALL = """'<tool_call>\\n{"name":' + (fn['name'] | tojson) + ',"arguments":'"""
KEPT_REASONING = "{%- set reasoning = message.get('reasoning_content') or message.get('reasoning') -%}"
# (agent.token_mode, agent.keep_reasoning) of each run
RUNS = (("messages", True), ("tokens", True), ("tokens", False))



def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def rewriting_template(model_dir: Path) -> str:
    """The model's own template, with earlier tool calls written compactly and earlier reasoning left out."""
    template = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert SAMPLED_CALL in template, "the demo template changed: update SAMPLED_CALL"
    assert KEPT_REASONING in template, "the demo template changed: update KEPT_REASONING"
    compact = template.replace(SAMPLED_CALL, COMPACT_CALL).replace(KEPT_REASONING, "{%- set reasoning = none -%}")
    return compact.replace(
        "{{- fn['arguments'] | tojson -}}",
        "{{- fn['arguments'] | tojson | replace('\": ', '\":') | replace(', \"', ',\"') -}}",
    )


def think_ids(model_dir: Path) -> tuple[int, int]:
    """The ids of ``<think>`` and ``</think>`` (added tokens of the demo tokenizer)."""
    added = {t["content"]: int(t["id"]) for t in json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]}
    return added["<think>"], added["</think>"]


@dataclass
class Session:
    harness: str
    mode: str
    keep_reasoning: bool
    result: SessionResult
    journal: list[Completion]
    results_file: Path
    journal_dir: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    require_vllm_python()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOAD_ENV, PLUGINS)
        missing = [h for h in HARNESSES if not get_harness(h).is_installed()]
        if missing:
            reason = f"CLIs not installed: {missing} (polar harness install ...)"
            pytest.fail(reason) if in_ci() else pytest.skip(reason)
        override = os.environ.get("POLAR_TINY_AGENT_MODEL")
        model_dir = Path(override) if override else tiny_agent.cached_model()
    work = tmp_path_factory.mktemp("token-mode-vllm")
    template = work / "rewriting.jinja"
    template.write_text(rewriting_template(model_dir))
    server = VllmServer(model_dir, work / "vllm.log", max_model_len=tiny_agent.MAX_MODEL_LEN,
                        extra_args=["--chat-template", str(template), "--reasoning-parser",
                                    tiny_agent.REASONING_PARSER])  # fmt: skip
    server.start()
    try:
        server.wait_ready()
        yield server.url, model_dir
    finally:
        server.stop()


def polar(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, LOAD_ENV: PLUGINS}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def sessions(served: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[Session]:
    url, _ = served
    out: list[Session] = []
    file, line = tiny_agent.TASKS[0]
    for mode, keep_reasoning in RUNS:
        for harness in HARNESSES:
            work = tmp_path_factory.mktemp(f"token-mode-{mode}-{'keep' if keep_reasoning else 'drop'}-{harness}")
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(LOAD_ENV, PLUGINS)
                spec = json.loads(tiny_agent.eval_task(harness, file, line, max_tokens=256, temperature=TEMPERATURE))
            spec["agent"].update(token_mode=mode, keep_reasoning=keep_reasoning)
            (work / "task.json").write_text(json.dumps(spec))
            run = polar("run", "task.json", "--backend", "vllm", "--backend-url", url, "--model", MODEL_NAME,
                        "--samples", str(SAMPLES), "--out", "results.jsonl", "--no-install", cwd=work)  # fmt: skip
            results = work / "results.jsonl"
            lines = results.read_text().splitlines() if results.exists() else []
            assert len(lines) == SAMPLES, run.stdout[-3000:] + run.stderr[-3000:]
            journal_dir = work / "polar-data" / "journal"
            for text in lines:
                result = SessionResult.model_validate_json(text)
                path = journal_dir / f"{result.session_id}.jsonl"
                out.append(Session(harness, mode, keep_reasoning, result, read_journal(path) if path.exists() else [],
                                   results, journal_dir))  # fmt: skip
    return out


def assert_multi_turn(sessions: list[Session]) -> None:
    """Every harness made multi-call sessions (at temperature 0.5 about one sample in ten answers without the tool)."""
    for harness in HARNESSES:
        calls = [len(s.journal) for s in sessions if s.harness == harness]
        assert max(calls) >= 2, (harness, calls, [s.result.error for s in sessions if s.harness == harness])


def verify_recompute(sessions: list[Session], model_dir: Path) -> None:
    """``polar verify --recompute`` on each run's results: every session of the run, once (a run of claude_code's
    35K-token prompts takes about 30 s)."""
    runs = {s.results_file: s for s in sessions}
    for results, session in runs.items():
        done = polar("verify", str(results), "--recompute", "--model", str(model_dir), "--journal",
                     str(session.journal_dir), cwd=results.parent)  # fmt: skip
        where = f"{session.mode} (keep_reasoning {session.keep_reasoning}) {session.harness}"
        assert done.returncode == 0, f"{where}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def rendering(client: httpx.Client, url: str, completion: Completion) -> list[int]:
    """The server's own rendering of the messages the completion was sent (its template, the generation prompt)."""
    body = {"model": MODEL_NAME, "messages": tokenize_messages(completion), "add_generation_prompt": True}
    if completion.request_tools:
        body["tools"] = completion.request_tools
    tokens: list[int] = client.post(f"{url}/tokenize", json=body).json()["tokens"]
    return tokens


def test_messages_mode_breaks_where_the_history_was_rerendered_and_recomputes_exactly(
    sessions: list[Session], served: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, model_dir = served
    think, _ = think_ids(model_dir)
    mine = [s for s in sessions if s.mode == "messages"]
    rerendered = 0
    lines = ["messages mode, rewriting template: harness, calls, chains, break causes (first sampled id left out)"]
    assert_multi_turn(mine)
    for session in mine:
        meta = session.result.trajectory.metadata
        causes = [b["cause"] for b in meta.get("breaks", [])]
        departed = [b["expected_ids"][:1] for b in meta.get("breaks", [])]
        lines.append(f"  {session.harness:12s} calls {len(session.journal)}  chains {meta.get('chains')}  {causes} "
                     f"{departed}")  # fmt: skip
        for brk in meta.get("breaks", []):
            assert brk["cause"], brk
            if brk["cause"] == "history_rerendered":
                rerendered += 1
                # the first sampled id the rendering left out: the reasoning the template dropped
                assert brk["expected_ids"][:1] == [think], brk
    verify_recompute(mine, model_dir)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert rerendered >= 1  # the template did rewrite what the model sampled, and the builder said so


def test_tokens_mode_gives_one_exact_chain_per_conversation_that_recomputes_exactly(
    sessions: list[Session], served: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    url, model_dir = served
    think, end_think = think_ids(model_dir)
    mine = [s for s in sessions if s.mode == "tokens" and s.keep_reasoning]
    lines = ["tokens mode, rewriting template: harness, calls, chains, spliced turns (edited), reasoning tokens kept"]
    with httpx.Client(timeout=120) as client:
        assert_multi_turn(mine)
        for session in mine:
            journal = session.journal
            if len(journal) < 2:
                continue  # a stray sample that answered without the tool: nothing to splice
            by_id = {c.completion_id: c for c in journal}
            spliced = edited = kept = 0
            for completion in journal:
                assert completion.token_mode == "tokens" and completion.prompt_spans
                base_id = completion.metadata["token_prompt"]["base"]
                assert not completion.metadata["token_prompt"]["reasoning_dropped"]
                # the server's own rendering of this call's messages: what every rendered span must come from
                rendered = rendering(client, url, completion)
                if base_id is None:
                    assert completion.prompt_ids == rendered
                    continue
                base = by_id[base_id]
                sampled = [*base.prompt_ids, *base.response_ids]
                assert completion.prompt_ids[: len(sampled)] == sampled, "the base's answer is not spliced as sampled"
                tail = completion.prompt_ids[len(sampled) :]
                assert tail and rendered[-len(tail) :] == tail, "the new messages are not the template's rendering"
                spliced += 1
                edited += sum(1 for s in completion.prompt_spans if s.edited)
                if think in base.response_ids:  # the answer reasoned: the prompt keeps what the template drops
                    assert think not in rendered[len(base.prompt_ids) :]
                    kept += base.response_ids.index(end_think) + 1
            meta = session.result.trajectory.metadata
            causes = [b["cause"] for b in meta.get("breaks", [])]
            assert not {"history_rerendered", "truncated_reply", "no_end_of_turn", "reasoning_dropped"} & set(causes)
            mains = [t for t in session.result.trajectory.traces if t.role == "main"]
            main_ids = mains[0].metadata.get("completion_ids") or []
            assert len(main_ids) >= 2, meta  # the conversation is one chain, across its turns
            lines.append(f"  {session.harness:12s} calls {len(journal)}  chains {meta.get('chains')}  spliced "
                         f"{spliced} ({edited})  reasoning tokens kept {kept}")  # fmt: skip
    verify_recompute(mine, model_dir)
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_tokens_mode_dropping_reasoning_breaks_the_chain_on_purpose_and_recomputes_exactly(
    sessions: list[Session], served: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    url, model_dir = served
    think, _ = think_ids(model_dir)
    mine = [s for s in sessions if s.mode == "tokens" and not s.keep_reasoning]
    lines = ["tokens mode, keep_reasoning false: harness, calls, chains, break causes"]
    dropped = 0
    with httpx.Client(timeout=120) as client:
        assert_multi_turn(mine)
        for session in mine:
            journal = session.journal
            by_id = {c.completion_id: c for c in journal}
            expected = []
            for completion in journal:
                built = completion.metadata["token_prompt"]
                base = by_id[built["base"]] if built["base"] is not None else None
                if base is not None and think not in base.response_ids:
                    continue  # an answer without reasoning: spliced as with keep_reasoning
                # rendered whole, as the template renders it: the earlier reasoning is gone
                assert completion.prompt_ids == rendering(client, url, completion)
                assert [s.source for s in completion.prompt_spans or []] == ["rendered"]
                if base is not None:
                    assert built["reasoning_dropped"] and think not in completion.prompt_ids[len(base.prompt_ids) :]
                    expected.append(completion.completion_id)
            meta = session.result.trajectory.metadata
            causes = {b["completion_id"]: b["cause"] for b in meta.get("breaks", [])}
            lines.append(f"  {session.harness:12s} calls {len(journal)}  chains {meta.get('chains')}  "
                         f"{list(causes.values())}")  # fmt: skip
            assert all(causes.get(c) == "reasoning_dropped" for c in expected), (expected, meta.get("breaks"))
            dropped += len(expected)
    verify_recompute(mine, model_dir)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert dropped >= 1


def test_the_papers_rule_marks_the_completions_whose_context_drifted(sessions: list[Session]) -> None:
    """``merge: prompt_prefix`` on the messages-mode sessions: the same journals, merged by the paper's looser rule,
    say which completions were not sampled in the context the trace gives them."""
    drifted = 0
    for session in (s for s in sessions if s.mode == "messages" and len(s.journal) >= 2):
        trajectory = build_trajectory("prefix_merging", session.journal, merge="prompt_prefix")
        for trace in trajectory.traces:
            flags = trace.metadata["context_exact"]
            assert flags[0] is True and trace.context_exact == all(flags)
            drifted += flags.count(False)
    assert drifted >= 1
