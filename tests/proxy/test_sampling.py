"""A task's ``agent.sampling`` under the trainer's control: the proxy forces it onto every model call of the task's
sessions, for every provider protocol, streaming or not (proved on the body a real upstream HTTP server receives),
caps ``max_tokens``, records what it forced next to what went upstream, and warns once per task when the recorded
logprobs are the raw distribution of a call sampled from a reshaped one."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from polar_cli.gateway.node import GatewayNode
from polar_cli.models import Completion, SamplingSpec
from polar_cli.models.inference import LogprobsMode
from polar_cli.proxy.sampling import RawLogprobsWarning, apply_sampling, reshaping
from tests.gateway.test_node import config as gateway_config
from tests.gateway.test_node import task as gateway_task

from .conftest import LoopThread, ProxySession, RunningProxy
from .upstream import Upstream

FAST_RETRY = {"attempts": 3, "base_delay_s": 0.001, "max_delay_s": 0.002}
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 64, "seed": 1234}
FORCED = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 64, "seed": 1234}
"""What every upstream body must carry under SAMPLING, whatever the harness asked."""


class CapturingUpstream(Upstream):
    """The fake vLLM, keeping every chat body it is sent (the proxy's upstream request, as the server sees it)."""

    def __init__(self, loop_thread: LoopThread) -> None:
        self.bodies: list[dict[str, Any]] = []
        super().__init__(loop_thread)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        return await super()._chat(request)


@pytest.fixture
def upstream(loop_thread: LoopThread) -> CapturingUpstream:
    return CapturingUpstream(loop_thread)


def vllm_proxy(start: Callable[..., RunningProxy], upstream: Upstream, **extra: Any) -> RunningProxy:
    return start(backend="vllm", backend_url=upstream.url, model="served-model", retry=FAST_RETRY, **extra)


# ---- one harness call per protocol, each asking for other sampling than the task's --------------------------------


def call(session: ProxySession, provider: str, *, stream: bool = False, **asked: Any) -> httpx.Response:
    """One model call in ``provider``'s wire shape; ``asked``: sampling fields, named as that protocol names them."""
    user = "hi"
    if provider == "openai_chat":
        url, headers = f"{session.openai_base}/chat/completions", {"Authorization": f"Bearer {session.api_key}"}
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": user}], "stream": stream}
    elif provider == "openai_responses":
        url, headers = f"{session.openai_base}/responses", {"Authorization": f"Bearer {session.api_key}"}
        body = {"model": "m", "input": user, "stream": stream}
    elif provider == "anthropic":
        url, headers = f"{session.anthropic_base}/v1/messages", {"x-api-key": session.api_key}
        body = {"model": "m", "max_tokens": 1000, "messages": [{"role": "user", "content": user}], "stream": stream}
    else:
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        url, headers = f"{session.google_base}/v1beta/models/m:{action}", {"x-goog-api-key": session.api_key}
        body = {"contents": [{"role": "user", "parts": [{"text": user}]}], "generationConfig": asked}
        asked = {}
    body.update(asked)
    response = httpx.post(url, headers=headers, json=body, timeout=60)
    response.read()
    return response


ASKED = {
    "openai_chat": {"temperature": 0.1, "top_p": 0.5, "top_k": 3, "seed": 7, "max_completion_tokens": 1000},
    "openai_responses": {"temperature": 0.1, "top_p": 0.5, "max_output_tokens": 1000},
    "anthropic": {"temperature": 0.1, "top_p": 0.5, "top_k": 3, "max_tokens": 1000},
    "google": {"temperature": 0.1, "topP": 0.5, "topK": 3, "seed": 7, "maxOutputTokens": 1000},
}
"""What each harness asks: other values than the task's, a max_tokens above its cap, in each protocol's own names."""


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("provider", list(ASKED))
def test_the_task_sampling_reaches_the_upstream_request_for_every_protocol(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream, provider: str, stream: bool
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    session = running.new_session(sampling=SAMPLING, metadata={"task_id": "t"})
    response = call(session, provider, stream=stream, **ASKED[provider])
    assert response.status_code == 200, response.text
    [sent] = upstream.bodies
    assert {k: sent.get(k) for k in FORCED} == FORCED
    assert sent["stream"] is stream  # pass-through streaming sent the forced values on the streaming request
    [record] = session.completions()
    assert record["provider"] == provider
    assert {k: record["request_params"].get(k) for k in FORCED} == FORCED  # what went upstream
    assert record["metadata"]["sampling"] == SAMPLING  # what the task forced
    assert record["request"] == json.loads(response.request.content)  # what the harness asked, untouched


def test_a_synthetic_stream_is_sampled_under_the_task_too(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream
) -> None:
    running = vllm_proxy(start_proxy, upstream, stream_mode="synthetic")
    session = running.new_session(sampling=SAMPLING)
    assert call(session, "anthropic", stream=True, **ASKED["anthropic"]).status_code == 200
    [sent] = upstream.bodies
    assert sent["stream"] is False and {k: sent.get(k) for k in FORCED} == FORCED


@pytest.mark.parametrize(
    ("asked", "sent"),
    [({"max_tokens": 1000}, 64), ({"max_tokens": 10}, 10), ({"max_completion_tokens": 20}, 20), ({}, 64)],
    ids=["above-the-cap", "below-the-cap", "max_completion_tokens", "none"],
)
def test_max_tokens_is_a_cap(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream, asked: dict[str, Any], sent: int
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    session = running.new_session(sampling={"max_tokens": 64})
    assert call(session, "openai_chat", temperature=0.3, **asked).status_code == 200
    [body] = upstream.bodies
    assert body["max_tokens"] == sent
    assert body["temperature"] == 0.3  # a field the task leaves unset stays the harness's
    assert "top_p" not in body and "seed" not in body
    [record] = session.completions()
    assert record["metadata"]["sampling"] == {"max_tokens": 64}


def test_without_a_task_sampling_the_harness_asks_for_itself(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    session = running.new_session()
    assert call(session, "google", **ASKED["google"]).status_code == 200
    [body] = upstream.bodies
    assert {k: body.get(k) for k in FORCED} == {"temperature": 0.1, "top_p": 0.5, "top_k": 3, "seed": 7,
                                                "max_tokens": 1000}  # fmt: skip
    [record] = session.completions()
    assert "sampling" not in record["metadata"]


def test_the_scripted_backend_records_the_forced_params(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "hello"}], sampling={"temperature": 1.0, "seed": 3})
    info = proxy.http.get(f"/sessions/{session.session_id}").json()
    assert info["sampling"] == {"temperature": 1.0, "seed": 3}
    assert call(session, "openai_responses", temperature=0.2).status_code == 200
    [record] = session.completions()
    Completion.model_validate(record)
    assert (record["request_params"]["temperature"], record["request_params"]["seed"]) == (1.0, 3)
    assert record["metadata"]["sampling"] == {"temperature": 1.0, "seed": 3}


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": -0.1}, "sampling.temperature"),
        ({"top_p": 0}, "sampling.top_p"),
        ({"top_p": 1.5}, "sampling.top_p"),
        ({"top_k": 0}, "sampling.top_k"),
        ({"max_tokens": 0}, "sampling.max_tokens"),
        ({"seed": "7"}, "sampling.seed"),
        ({"temperature": True}, "sampling.temperature"),
        ({"temprature": 0.5}, "sampling.temprature"),
    ],
)
def test_post_sessions_refuses_bad_sampling_with_a_400(
    proxy: RunningProxy, sampling: dict[str, Any], field: str
) -> None:
    before = len(proxy.http.get("/sessions").json()["sessions"])
    response = proxy.http.post("/sessions", json={"sampling": sampling})
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]
    assert len(proxy.http.get("/sessions").json()["sessions"]) == before  # nothing was created


# ---- honest logprobs -----------------------------------------------------------------------------------------------


def logprobs_mode(running: RunningProxy, mode: LogprobsMode) -> None:
    """What the proxy's backend says of its logprobs (the vllm backend's ``logprobs_mode`` option, or the server's)."""
    for client in running.state.pool.clients():
        client.logprobs_mode = mode


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "polar.proxy" and "raw logprobs" in r.getMessage()]


def test_raw_logprobs_of_a_reshaped_distribution_are_warned_about_once_per_task(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    logprobs_mode(running, "raw")
    hot = {"temperature": 0.6}
    sessions = [
        running.new_session(sampling=hot, metadata={"task_id": "task-a", "sample_index": 0}),
        running.new_session(sampling=hot, metadata={"task_id": "task-a", "sample_index": 1}),
        running.new_session(sampling=hot, metadata={"task_id": "task-b"}),
        running.new_session(sampling={"temperature": 1.0}, metadata={"task_id": "task-c"}),  # the raw one: honest
        running.new_session(metadata={"task_id": "task-d"}),  # the server's default: not known to be reshaped
    ]
    with caplog.at_level(logging.WARNING, logger="polar.proxy"):
        for session in sessions:
            for provider, stream in (("openai_chat", False), ("anthropic", True)):
                assert call(session, provider, stream=stream, max_tokens=5).status_code == 200
    warned = warnings_of(caplog)
    assert len(warned) == 2, warned
    assert warned[0].startswith("task task-a samples with temperature 0.6") and "task task-b" in warned[1]
    assert "--logprobs-mode processed_logprobs" in warned[0] and "logprobs_mode: processed" in warned[0]
    assert "temperature 1" in warned[0]
    records = [r for s in sessions for r in s.completions()]
    assert len(records) == 10 and {r["logprobs_mode"] for r in records} == {"raw"}


def test_the_harness_temperature_counts_when_the_task_sets_none_and_the_session_id_keys_it(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    logprobs_mode(running, "raw")
    session = running.new_session(sampling={"seed": 1})
    with caplog.at_level(logging.WARNING, logger="polar.proxy"):
        for _ in range(2):
            assert call(session, "openai_chat", temperature=0.5).status_code == 200
    [warned] = warnings_of(caplog)
    assert warned.startswith(f"task {session.session_id} samples with temperature 0.5")


def test_processed_logprobs_are_not_warned_about_and_are_recorded(
    start_proxy: Callable[..., RunningProxy], upstream: CapturingUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    logprobs_mode(running, "processed")
    session = running.new_session(sampling={"temperature": 0.3, "top_p": 0.8})
    with caplog.at_level(logging.WARNING, logger="polar.proxy"):
        assert call(session, "openai_chat").status_code == 200
    assert warnings_of(caplog) == []
    [record] = session.completions()
    assert record["logprobs_mode"] == "processed"


# ---- the gateway: a task's agent.sampling reaches its sessions ------------------------------------------------------


def test_a_gateway_session_is_sampled_under_its_task(tmp_path: Path) -> None:
    """A real gateway node, the shell harness's agent asking temperature 0.1 and 1000 tokens: the journal of its
    session records the task's sampling, forced over it."""
    agent = """
import json, os, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
body = {"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.1, "max_tokens": 1000}
urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)).read()
"""
    request = gateway_task("sampled", {})
    request.agent.config = {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": agent}}
    request.agent.sampling = SamplingSpec.model_validate(SAMPLING)

    async def body() -> str:
        async with GatewayNode(gateway_config(tmp_path)) as node:
            job = await node.submit(request)
            result = await node.pipeline.wait(job.session_id)
            assert (result.status, result.num_completions) == ("completed", 1), result.error
            return job.session_id

    session_id = asyncio.run(body())
    [line] = (tmp_path / "data" / "journal" / f"{session_id}.jsonl").read_text().splitlines()
    record = Completion.model_validate_json(line)
    assert {k: record.request_params.get(k) for k in FORCED} == FORCED
    assert record.metadata["sampling"] == SAMPLING
    assert record.request["temperature"] == 0.1


# ---- units ---------------------------------------------------------------------------------------------------------


def test_apply_sampling_replaces_and_caps() -> None:
    params: dict[str, Any] = {"temperature": 0.1, "max_tokens": 500, "stop": ["x"]}
    apply_sampling(params, SamplingSpec(temperature=0.0, top_k=-1, max_tokens=100))
    assert params == {"temperature": 0.0, "top_k": -1, "max_tokens": 100, "stop": ["x"]}
    params = {"max_tokens": "lots"}  # not a number: the cap is what goes up
    apply_sampling(params, SamplingSpec(max_tokens=8))
    assert params == {"max_tokens": 8}
    params = {"top_p": 0.5}
    apply_sampling(params, SamplingSpec())
    assert params == {"top_p": 0.5}


def test_reshaping_names_what_makes_the_distribution_not_the_raw_one() -> None:
    assert reshaping({}) == []
    assert reshaping({"temperature": 1, "top_p": 1.0, "top_k": -1, "min_p": 0, "repetition_penalty": 1.0}) == []
    assert reshaping({"top_k": 0, "presence_penalty": 0.0, "temperature": True}) == []
    assert reshaping({"temperature": 0.7, "top_p": 0.95, "top_k": 20, "frequency_penalty": 0.5}) == [
        "temperature 0.7", "top_p 0.95", "top_k 20", "frequency_penalty 0.5"]  # fmt: skip


def test_the_warning_remembers_the_most_recent_tasks(caplog: pytest.LogCaptureFixture) -> None:
    warning = RawLogprobsWarning(remember=2)
    hot = {"temperature": 0.5}
    with caplog.at_level(logging.WARNING, logger="polar.proxy"):
        assert warning.check("a", hot, "raw") and not warning.check("a", hot, "raw")
        assert not warning.check("b", hot, "processed") and not warning.check("b", hot, None)
        assert not warning.check("b", {"temperature": 1.0}, "raw")
        assert warning.check("b", hot, "raw") and warning.check("c", hot, "raw")
        assert warning.check("a", hot, "raw")  # forgotten: two newer tasks came after it
    assert len(warnings_of(caplog)) == 4
