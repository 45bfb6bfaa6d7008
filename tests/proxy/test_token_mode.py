"""Token mode on the scripted backend (which implements the token-in contract: docs/scripted-backend.md): the proxy
builds each prompt as ids, splicing earlier answers in exactly as sampled, through the official SDKs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from polar_cli.builders import build_trajectory
from polar_cli.models import Completion
from polar_cli.proxy.render import ChatRenderer, load_tokenizer

from .conftest import ProxySession, RunningProxy, closing

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
CALL = {"content": None, "tool_calls": [{"function": {"name": "bash", "arguments": {"cmd": "ls  -la"}}}]}
SCRIPT = [CALL, {"content": "There is one file."}]


def _openai(session: ProxySession) -> openai.OpenAI:
    return closing(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))


def _conversation(
    api: openai.OpenAI, *, stream: bool, echo: Callable[[dict[str, Any]], dict[str, Any]] = lambda m: m
) -> list[Any]:
    """Two calls, the harness's way: call, run the tool, send everything back (``echo`` may change the turn)."""
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list files"}]
    first = api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    turn = first.choices[0].message.model_dump(exclude_none=True)
    call = turn["tool_calls"][0]
    messages += [echo(turn), {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
    if stream:
        pieces = list(api.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    else:
        text = api.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message.content
    assert text == "There is one file."
    return messages


def _normalized_args(turn: dict[str, Any]) -> dict[str, Any]:
    """What pi does to arguments: parsed and written back compactly (here: the command's spaces squeezed)."""
    turn = json.loads(json.dumps(turn))
    fn = turn["tool_calls"][0]["function"]
    fn["arguments"] = json.dumps({"cmd": " ".join(json.loads(fn["arguments"])["cmd"].split())})
    return turn


@pytest.mark.parametrize("stream", [False, True])
def test_an_edited_turn_is_spliced_as_sampled_and_the_rest_rendered(
    proxy: RunningProxy, demo_tokenizer: Any, stream: bool
) -> None:
    session = proxy.new_session(script=SCRIPT, token_mode="tokens")
    messages = _conversation(_openai(session), stream=stream, echo=_normalized_args)
    first, second = (Completion.model_validate(c) for c in session.completions())
    assert first.token_mode == second.token_mode == "tokens"
    renderer = ChatRenderer(load_tokenizer(str(demo_tokenizer)))
    # the whole second prompt, as the template renders the harness's (edited) conversation
    rendered = renderer.prompt_ids(messages, TOOLS)
    sampled = [*first.prompt_ids, *first.response_ids]
    assert second.prompt_ids[: len(sampled)] == sampled  # the model sees what it sampled ...
    assert rendered[: len(first.prompt_ids)] == first.prompt_ids
    assert rendered[len(first.prompt_ids) : len(sampled)] != first.response_ids  # ... not the harness's edit
    tail = second.prompt_ids[len(sampled) :]
    assert rendered[-len(tail) :] == tail  # tool result and generation prompt: the template's
    spans = [(s.start, s.end, s.source, s.completion_id, s.edited) for s in second.prompt_spans or []]
    assert spans == [
        (0, len(first.prompt_ids), "rendered", None, False),
        (len(first.prompt_ids), len(sampled), "spliced", first.completion_id, True),
        (len(sampled), len(second.prompt_ids), "rendered", None, False),
    ]
    assert second.metadata["token_prompt"]["base"] == first.completion_id
    assert second.metadata["token_prompt"]["edited"] is True
    trajectory = build_trajectory("prefix_merging", [first, second])
    assert len(trajectory.traces) == 1  # one chain, context-exact
    trace = trajectory.traces[0]
    assert [*trace.prompt_ids, *trace.response_ids] == [*second.prompt_ids, *second.response_ids]


def test_an_unchanged_echo_is_spliced_unedited(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=SCRIPT, token_mode="tokens")
    _conversation(_openai(session), stream=False)
    _first, second = (Completion.model_validate(c) for c in session.completions())
    assert [s.source for s in second.prompt_spans or []] == ["rendered", "spliced", "rendered"]
    assert not any(s.edited for s in second.prompt_spans or [])


def test_messages_mode_records_no_spans(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=SCRIPT)
    _conversation(_openai(session), stream=False)
    recorded = [Completion.model_validate(c) for c in session.completions()]
    assert all(c.token_mode == "messages" and c.prompt_spans is None for c in recorded)


def test_anthropic_messages_in_token_mode(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=SCRIPT, token_mode="tokens")
    api = closing(anthropic.Anthropic(base_url=session.anthropic_base, api_key=session.api_key, max_retries=0))
    tools: Any = [{"name": "bash", "description": "run", "input_schema": TOOLS[0]["function"]["parameters"]}]
    history: list[Any] = [{"role": "user", "content": "list files"}]
    first = api.messages.create(model="m", max_tokens=64, messages=history, tools=tools)
    use = next(b for b in first.content if b.type == "tool_use")
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]},
    ]
    with api.messages.stream(model="m", max_tokens=64, messages=history, tools=tools) as stream:
        assert stream.get_final_text() == "There is one file."
    one, two = (Completion.model_validate(c) for c in session.completions())
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.response_ids)] == [*one.prompt_ids, *one.response_ids]
    assert [s.source for s in two.prompt_spans or []] == ["rendered", "spliced", "rendered"]


def test_reasoning_dropped_on_purpose_renders_the_whole_prompt(proxy: RunningProxy) -> None:
    script = [{**CALL, "reasoning_content": "I should look."}, {"content": "There is one file."}]
    session = proxy.new_session(script=script, token_mode="tokens", keep_reasoning=False)
    _conversation(_openai(session), stream=False)
    first, second = (Completion.model_validate(c) for c in session.completions())
    assert [s.source for s in second.prompt_spans or []] == ["rendered"]
    assert second.metadata["token_prompt"] == {
        "base": first.completion_id,
        "edited": False,
        "reasoning_dropped": True,
        "rendered_tokens": len(second.prompt_ids),
    }


def test_reasoning_kept_by_default_is_spliced(proxy: RunningProxy) -> None:
    script = [{**CALL, "reasoning_content": "I should look."}, {"content": "There is one file."}]
    session = proxy.new_session(script=script, token_mode="tokens")
    _conversation(_openai(session), stream=False)
    first, second = (Completion.model_validate(c) for c in session.completions())
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == [
        *first.prompt_ids, *first.response_ids]  # fmt: skip


def test_a_truncated_reply_is_spliced_and_the_template_closes_it(proxy: RunningProxy) -> None:
    script = [{"content": "Let me think about th", "finish_reason": "length"}, {"content": "Done."}]
    session = proxy.new_session(script=script, token_mode="tokens")
    api = _openai(session)
    messages: list[Any] = [{"role": "user", "content": "go"}]
    cut = api.chat.completions.create(model="m", messages=messages).choices[0]
    assert cut.finish_reason == "length"
    messages += [{"role": "assistant", "content": cut.message.content}, {"role": "user", "content": "go on"}]
    api.chat.completions.create(model="m", messages=messages)
    first, second = (Completion.model_validate(c) for c in session.completions())
    sampled = [*first.prompt_ids, *first.response_ids]
    assert second.prompt_ids[: len(sampled)] == sampled
    assert [s.source for s in second.prompt_spans or []] == ["rendered", "spliced", "rendered"]


def test_a_backend_without_token_in_refuses_a_token_mode_session(
    start_proxy: Callable[..., RunningProxy], demo_tokenizer: Any
) -> None:
    running = start_proxy(backend="openai", backend_url="http://127.0.0.1:9/v1", model="m",
                          tokenizer=str(demo_tokenizer))  # fmt: skip
    resp = running.http.post("/sessions", json={"token_mode": "tokens"})
    assert resp.status_code == 400, resp.text
    assert "token-in" in resp.text and "--enable-scale-out" in resp.text


def _spliced_once(session: ProxySession) -> None:
    one, two = (Completion.model_validate(c) for c in session.completions())
    assert two.token_mode == "tokens"
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.response_ids)] == [*one.prompt_ids, *one.response_ids]
    assert [s.source for s in two.prompt_spans or []] == ["rendered", "spliced", "rendered"]


def test_openai_responses_in_token_mode(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=SCRIPT, token_mode="tokens")
    api = _openai(session)
    tools: Any = [{"type": "function", "name": "bash", "parameters": TOOLS[0]["function"]["parameters"]}]
    first = api.responses.create(model="m", input="list files", tools=tools)
    call = next(item for item in first.output if item.type == "function_call")
    follow: Any = [{"role": "user", "content": "list files"}, call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}]  # fmt: skip
    with api.responses.stream(model="m", input=follow, tools=tools) as stream:
        assert stream.get_final_response().output_text == "There is one file."
    _spliced_once(session)


def test_google_in_token_mode(proxy: RunningProxy) -> None:
    from google import genai
    from google.genai import types

    session = proxy.new_session(script=SCRIPT, token_mode="tokens")
    options = types.HttpOptions(base_url=session.google_base, retry_options=types.HttpRetryOptions(attempts=1))
    sdk = closing(genai.Client(api_key=session.api_key, http_options=options))
    bash = types.FunctionDeclaration(
        name="bash", description="run", parameters_json_schema=TOOLS[0]["function"]["parameters"]
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[bash])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    history: list[Any] = [types.Content(role="user", parts=[types.Part(text="list files")])]
    first = sdk.models.generate_content(model="m", contents=history, config=config)
    assert first.candidates and first.candidates[0].content and first.function_calls
    history += [first.candidates[0].content, types.Content(role="user", parts=[types.Part(
        function_response=types.FunctionResponse(name="bash", response={"output": "a.txt"}))])]  # fmt: skip
    text = "".join(c.text or "" for c in sdk.models.generate_content_stream(model="m", contents=history, config=config))
    assert text == "There is one file."
    _spliced_once(session)


def test_a_vllm_server_without_the_token_routes_fails_the_backend_check_in_one_line(loop_thread: Any) -> None:
    """What vllm 0.32 answers on the token routes when it was started without ``--enable-scale-out`` (403, its own
    message), from a stand-in server: every test server of the suite runs with the flag."""
    from aiohttp import web

    from polar_cli.errors import BackendError
    from polar_cli.registry import get_backend

    disabled = {"error": {"message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out "
                          "to enable them.", "type": "PermissionDeniedError", "code": 403}}  # fmt: skip

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def refused(_: web.Request) -> web.Response:
        return web.json_response(disabled, status=403)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions/render", refused)
    app.router.add_post("/inference/v1/generate", refused)
    url = loop_thread.serve(app)

    async def check() -> None:
        client = get_backend("vllm").client(url=url, model="m")
        try:
            await client.preflight(10)
            await client.check_token_in(10)
        finally:
            await client.close()

    with pytest.raises(BackendError) as failed:
        loop_thread.run(check())
    message = str(failed.value)
    assert "\n" not in message and "/v1/chat/completions/render" in message and "--enable-scale-out" in message
    assert url in message
