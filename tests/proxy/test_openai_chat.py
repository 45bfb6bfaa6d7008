"""OpenAI Chat Completions through the proxy with the official `openai` SDK (scripted backend, demo tokenizer)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from polar_cli.proxy.render import ChatRenderer, load_tokenizer

from .conftest import ProxySession, RunningProxy

Client = Callable[[ProxySession], openai.OpenAI]

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
SCRIPT = [
    {"content": None, "tool_calls": [{"function": {"name": "bash", "arguments": {"cmd": "ls"}}}]},
    {"content": "There is one file.", "reasoning_content": "The tool printed one name."},
]


@pytest.fixture
def client() -> Iterator[Callable[[ProxySession], openai.OpenAI]]:
    """An SDK client for a session (closed after the test: warnings are errors, leaked sockets too)."""
    made: list[openai.OpenAI] = []

    def make(session: ProxySession) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))
        return made[-1]

    yield make
    for api in made:
        api.close()


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(proxy: RunningProxy, client: Client, demo_tokenizer: Any, stream: bool) -> None:
    session = proxy.new_session(script=SCRIPT)
    api = client(session)
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list files"}]
    if stream:
        chunks = list(api.chat.completions.create(model="qwen", messages=messages, tools=TOOLS, stream=True))
        call = chunks[1].choices[0].delta.tool_calls[0]  # type: ignore[index]
        call_id, name = call.id, call.function.name  # type: ignore[union-attr]
        args = "".join(
            tc.function.arguments or ""
            for c in chunks
            if c.choices and c.choices[0].delta.tool_calls
            for tc in c.choices[0].delta.tool_calls
            if tc.function
        )
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    else:
        first = api.chat.completions.create(model="qwen", messages=messages, tools=TOOLS)
        assert first.choices[0].finish_reason == "tool_calls"
        assert first.model == "qwen"
        tool_call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        call_id, name, args = tool_call.id, tool_call.function.name, tool_call.function.arguments  # type: ignore[union-attr]
    assert name == "bash" and json.loads(args) == {"cmd": "ls"}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "hello.txt"},
    ]
    if stream:
        text = "".join(
            c.choices[0].delta.content or ""
            for c in api.chat.completions.create(model="qwen", messages=messages, tools=TOOLS, stream=True)
            if c.choices
        )
    else:
        second = api.chat.completions.create(model="qwen", messages=messages, tools=TOOLS)
        assert second.choices[0].finish_reason == "stop"
        assert second.usage is not None and second.usage.completion_tokens > 0
        text = second.choices[0].message.content or ""
    assert text == "There is one file."

    records = session.completions()
    assert [r["index"] for r in records] == [0, 1]  # exactly one record per generation call
    renderer = ChatRenderer(load_tokenizer(str(demo_tokenizer)))
    for record in records:
        assert record["provider"] == "openai_chat" and record["token_source"] == "backend"
        assert record["request_messages"][0]["role"] == "system"
        assert record["prompt_ids"] == renderer.prompt_ids(record["request_messages"], record["request_tools"])
        assert len(record["response_logprobs"]) == len(record["response_ids"])
        assert record["response_ids"][-1] == renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the second prompt extends the first prompt + sampled turn (the demo template re-renders it identically)
    assert records[1]["prompt_ids"][: len(records[0]["prompt_ids"]) + len(records[0]["response_ids"])] == (
        records[0]["prompt_ids"] + records[0]["response_ids"]
    )
    assert records[1]["response_message"]["reasoning_content"] == "The tool printed one name."


def sse_frames(raw: str) -> list[str]:
    assert raw.endswith("\n\n")
    frames = raw.split("\n\n")[:-1]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames)
    return [f[len("data: ") :] for f in frames]


def test_exact_stream_sequence(synthetic_proxy: RunningProxy) -> None:
    session = synthetic_proxy.new_session(
        script=[
            {
                "content": "Running it.",
                "tool_calls": [
                    {"function": {"name": "bash", "arguments": '{"cmd": "ls"}'}},
                    {"function": {"name": "bash", "arguments": {"cmd": "pwd"}}},
                ],
            }
        ]
    )
    resp = httpx.post(
        f"{session.openai_base}/chat/completions",
        headers={"Authorization": f"Bearer {session.api_key}"},
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "go"}],
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(resp.text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Running it."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": deltas[2]["tool_calls"][0]["id"],
                    "type": "function",  # type: ignore[index]
                    "function": {"name": "bash", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": "ls"}'}}]},
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": deltas[4]["tool_calls"][0]["id"],
                    "type": "function",  # type: ignore[index]
                    "function": {"name": "bash", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"cmd":"pwd"}'}}]},
        {},
        None,
    ]
    assert [c["choices"][0]["finish_reason"] if c["choices"] else "usage" for c in chunks][-2:] == [
        "tool_calls",
        "usage",
    ]
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] > 0
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_passthrough_stream_sequence(proxy: RunningProxy) -> None:
    """Pass-through: the same answer arrives in the upstream's pieces; each tool call opens with its id and name and
    then streams its arguments, and the finish and usage chunks end the stream."""
    calls = [
        {"function": {"name": "bash", "arguments": '{"cmd": "ls"}'}},
        {"function": {"name": "bash", "arguments": '{"cmd":"pwd"}'}},
    ]
    session = proxy.new_session(script=[{"content": "Running it.", "tool_calls": calls}])
    resp = httpx.post(
        f"{session.openai_base}/chat/completions",
        headers={"Authorization": f"Bearer {session.api_key}"},
        json={"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS, "stream": True,
              "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert resp.status_code == 200
    frames = sse_frames(resp.text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == "Running it."
    assert len([d for d in deltas if d.get("content")]) > 1  # streamed in pieces, not replayed whole
    fragments = [f for d in deltas for f in d.get("tool_calls") or []]
    for index, call in enumerate(calls):
        mine = [f for f in fragments if f["index"] == index]
        assert mine[0]["id"] and mine[0]["type"] == "function" and mine[0]["function"]["name"] == "bash"
        assert all("id" not in f for f in mine[1:])
        assert "".join(f["function"].get("arguments") or "" for f in mine) == call["function"]["arguments"]
    first_of_second = fragments.index(next(f for f in fragments if f["index"] == 1))
    assert all(f["index"] == 0 for f in fragments[:first_of_second])  # calls do not interleave
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["choices"] == []
    [record] = session.completions()
    assert chunks[-1]["usage"]["completion_tokens"] == len(record["response_ids"])
    assert chunks[-1]["usage"]["prompt_tokens"] == len(record["prompt_ids"])


def test_stream_without_usage_has_no_usage_chunk(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "hi"}])
    resp = httpx.post(
        f"{session.openai_base}/chat/completions",
        headers={"Authorization": f"Bearer {session.api_key}"},
        json={"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True},
    )
    chunks = [json.loads(f) for f in sse_frames(resp.text)[:-1]]
    assert all(c["choices"] and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_normalization_merges_system_and_flattens_text_parts(proxy: RunningProxy, client: Client) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    client(session).chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "A."},
            {"role": "developer", "content": [{"type": "text", "text": "B."}]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        ],
        max_completion_tokens=50,
        temperature=0.5,
        extra_body={"some_unknown_field": 1},
    )
    record = session.completions()[0]
    assert record["request_messages"] == [
        {"role": "system", "content": "A.\n\nB."},
        {"role": "user", "content": "x\ny"},
    ]
    assert record["request_params"] == {"max_tokens": 50, "temperature": 0.5}
    assert record["request"]["some_unknown_field"] == 1  # the original body is kept verbatim


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "messages": []}, "'messages' must be a non-empty list"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3}, "n=1"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ],
)
def test_malformed_requests_get_a_400_in_shape(
    proxy: RunningProxy, client: Client, body: dict[str, Any], needle: str
) -> None:
    session = proxy.new_session(script=[{"content": "never"}])
    with pytest.raises(openai.BadRequestError) as info:
        client(session).chat.completions.create(**body)
    assert needle in info.value.message
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert session.completions() == []
