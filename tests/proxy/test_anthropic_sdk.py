"""The official ``anthropic`` SDK against the real proxy (scripted backend, demo tokenizer).

Every answer and stream is parsed by the SDK with strict response validation; every generation call leaves exactly
one Completion in the session's journal and side calls (count_tokens) leave none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from anthropic import Anthropic

from polar_cli.proxy.codecs.common import sign_thinking

BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"},
}
PROMPT = [{"role": "user", "content": "Create hello.txt"}]


@pytest.fixture
def client() -> Iterator[Callable[..., Anthropic]]:
    """``client(session, api_key=None)``: a strict SDK client for a session; every client is closed afterwards."""
    made: list[Anthropic] = []

    def make(session: Any, api_key: str | None = None) -> Anthropic:
        sdk = Anthropic(
            base_url=session.anthropic_base,
            api_key=api_key or session.api_key,
            max_retries=0,
            _strict_response_validation=True,
        )
        made.append(sdk)
        return sdk

    yield make
    for sdk in made:
        sdk.close()


def bash_turn(call_id: str, command: str, **extra: Any) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "Bash", "arguments": {"command": command}}}
    return {"tool_calls": [call], **extra}


def test_text_answer_non_streaming(client: Callable[..., Anthropic], proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Hello there."}])
    message = client(session).messages.create(
        model="claude-x",
        max_tokens=256,
        system=[{"type": "text", "text": "Be brief."}],
        messages=PROMPT,
        stop_sequences=["END"],
        metadata={"user_id": "u1"},
        cache_control={"type": "ephemeral"},
        extra_body={"temperature": 0.2},  # anthropic 2.x no longer has the argument; older clients send it
    )
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello there." and message.stop_reason == "end_turn"
    assert message.id.startswith("msg_") and message.model == "claude-x"
    [record] = session.completions()
    assert record["provider"] == "anthropic" and record["metadata"]["stream"] is False
    assert record["request_messages"] == [{"role": "system", "content": "Be brief."}, *PROMPT]
    assert record["request_params"] == {"max_tokens": 256, "temperature": 0.2, "stop": ["END"]}
    assert message.usage.input_tokens == len(record["prompt_ids"])
    assert message.usage.output_tokens == len(record["response_ids"])


def test_raw_stream_events_in_order(client: Callable[..., Anthropic], proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Streamed " * 80}])
    events = list(client(session).messages.create(model="claude-x", max_tokens=256, messages=PROMPT, stream=True))
    types = [event.type for event in events]
    # the SDK swallows ping events (the codec's unit tests check that one is sent)
    assert types[:2] == ["message_start", "content_block_start"] and types[-3] == "content_block_stop"
    assert types[-2:] == ["message_delta", "message_stop"]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert len(deltas) > 1 and "".join(deltas) == "Streamed " * 80
    assert len(session.completions()) == 1


def test_stream_helper_thinking_round_trip(client: Callable[..., Anthropic], proxy: Any) -> None:
    session = proxy.new_session(
        script=[{"content": "It is 4.", "reasoning_content": "2 + 2 = 4."}, {"content": "You are welcome."}]
    )
    sdk = client(session)
    with sdk.messages.stream(
        model="claude-x",
        max_tokens=256,
        messages=[{"role": "user", "content": "2+2?"}],
        thinking={"type": "enabled", "budget_tokens": 128},
    ) as stream:
        assert "".join(stream.text_stream) == "It is 4."
        first = stream.get_final_message()
    thinking, text = first.content
    assert thinking.type == "thinking" and thinking.thinking == "2 + 2 = 4."
    assert thinking.signature == sign_thinking("2 + 2 = 4.") and text.type == "text"
    history = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": "thanks"},
    ]
    second = sdk.messages.create(model="claude-x", max_tokens=256, messages=history)  # type: ignore[arg-type]
    assert second.content[0].type == "text" and second.content[0].text == "You are welcome."
    records = session.completions()
    assert len(records) == 2
    assert records[1]["request_messages"][1] == {
        "role": "assistant",
        "content": "It is 4.",
        "reasoning_content": "2 + 2 = 4.",
    }


@pytest.mark.parametrize("streaming", [False, True])
def test_tool_call_round_trip(client: Callable[..., Anthropic], proxy: Any, streaming: bool) -> None:
    session = proxy.new_session(script=[bash_turn("toolu_01", "echo hi > hello.txt"), {"content": "Done."}])
    sdk = client(session)
    request: dict[str, Any] = {"model": "claude-x", "max_tokens": 512, "tools": [BASH], "messages": list(PROMPT)}
    if streaming:
        with sdk.messages.stream(**request) as stream:
            first = stream.get_final_message()
    else:
        first = sdk.messages.create(**request)
    assert first.stop_reason == "tool_use"
    [tool_use] = first.content
    assert tool_use.type == "tool_use" and tool_use.id == "toolu_01" and tool_use.name == "Bash"
    assert tool_use.input == {"command": "echo hi > hello.txt"}
    request["messages"] += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "(no output)"}]},
    ]
    if streaming:
        with sdk.messages.stream(**request) as stream:
            second = stream.get_final_message()
    else:
        second = sdk.messages.create(**request)
    assert second.stop_reason == "end_turn" and second.content[0].type == "text" and second.content[0].text == "Done."
    records = session.completions()
    assert len(records) == 2 and [r["finish_reason"] for r in records] == ["tool_calls", "stop"]
    assert records[1]["request_messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command":"echo hi > hello.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "(no output)"},
    ]
    assert records[1]["request_tools"][0]["function"]["parameters"] == BASH["input_schema"]


def test_count_tokens_is_a_side_call(client: Callable[..., Anthropic], proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Counted."}])
    sdk = client(session)
    counted = sdk.messages.count_tokens(model="claude-x", system="Be brief.", messages=PROMPT, tools=[BASH])  # type: ignore[list-item]
    assert session.completions() == []
    message = sdk.messages.create(model="claude-x", max_tokens=64, system="Be brief.", messages=PROMPT, tools=[BASH])  # type: ignore[list-item]
    assert counted.input_tokens == message.usage.input_tokens > 0
    assert len(session.completions()) == 1


def test_errors_are_typed_by_the_sdk(client: Callable[..., Anthropic], proxy: Any) -> None:
    session = proxy.new_session(script=[{"error": {"status": 500, "message": "backend exploded"}}])
    other = proxy.new_session(script=[{"content": "never"}])
    wrong_key = client(other, api_key=session.api_key)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        wrong_key.messages.create(model="claude-x", max_tokens=8, messages=PROMPT)
    assert auth.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key for this session"},
    }
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client(session).messages.create(model="claude-x", max_tokens=0, messages=PROMPT)
    with pytest.raises(anthropic.InternalServerError, match="backend exploded") as failed:
        client(session).messages.create(model="claude-x", max_tokens=8, messages=PROMPT, stream=True)
    assert isinstance(failed.value.body, dict) and failed.value.body["error"]["type"] == "api_error"
    assert session.completions() == [] and other.completions() == []
