"""Unit tests of the Anthropic Messages codec: request normalization, answers, stream event order, errors."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from polar_cli.errors import ProtocolError
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.codecs import detect, get_codec
from polar_cli.proxy.codecs.anthropic import AnthropicCodec
from polar_cli.proxy.codecs.base import Route
from polar_cli.proxy.codecs.common import sign_thinking

CODEC = AnthropicCodec()
ROUTE = Route(path="/v1/messages")
BASH = {
    "name": "Bash",
    "description": "Run a command.",
    "cache_control": {"type": "ephemeral"},
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}


def generation(message: dict[str, Any], finish: str = "stop") -> Generation:
    return Generation(
        id="chatcmpl-1",
        model="m",
        message={"role": "assistant", **message},
        finish_reason=finish,
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
    )


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    frames = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = orjson.loads(data_line[6:])
        assert data["type"] == event_line[7:]  # every frame names its event, and it matches the payload
        frames.append((event_line[7:], data))
    return frames


def test_detection_and_registry() -> None:
    assert detect("POST", "/v1/messages", {}, {}).provider == "anthropic"
    found = detect("POST", "/v1/messages/count_tokens", {"anthropic-beta": "x"}, {"beta": "true"})
    assert (found.kind, found.provider) == ("count_tokens", "anthropic")
    assert isinstance(get_codec("anthropic"), AnthropicCodec)


def test_system_blocks_merge_and_billing_header_is_stripped() -> None:
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be careful."},
    ]
    request = CODEC.decode(body(system=system), ROUTE)
    assert request.messages[0] == {"role": "system", "content": "You are Claude Code.\n\nBe careful."}
    string_form = CODEC.decode(body(system="x-anthropic-billing-header: a=1;\nReal prompt."), ROUTE)
    assert string_form.messages[0] == {"role": "system", "content": "Real prompt."}
    assert CODEC.decode(body(), ROUTE).messages == [{"role": "user", "content": "hi"}]
    # Claude Code 2.1 with an unknown model name puts a system message after the prompt: merged into the leading one
    late = [{"role": "user", "content": "hi"}, {"role": "system", "content": "Agent types: ..."}]
    assert CODEC.decode(body(system="Main.", messages=late), ROUTE).messages == [
        {"role": "system", "content": "Main.\n\nAgent types: ..."},
        {"role": "user", "content": "hi"},
    ]


def test_tool_round_trip_history() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should run ls.", "signature": "foreign-signature"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Running it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls -a", "n": 1}},
                {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pwd"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and then?"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "a.txt\nb.txt",
                    "cache_control": {"type": "ephemeral"},
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "<tool_use_error>no</tool_use_error>"}],
                },
            ],
        },
    ]
    request = CODEC.decode(body(messages=messages, tools=[BASH]), ROUTE)
    assert request.messages == [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "Running it.",
            "reasoning_content": "I should run ls.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command":"ls -a","n":1}'},
                },
                {"id": "toolu_2", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"pwd"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "<tool_use_error>no</tool_use_error>"},
        {"role": "user", "content": "and then?"},
    ]
    assert request.tools == [
        {
            "type": "function",
            "function": {"name": "Bash", "description": "Run a command.", "parameters": BASH["input_schema"]},
        }
    ]


def test_images_become_data_urls() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "screenshot"}, image]}
            ],
        },
    ]
    request = CODEC.decode(body(messages=messages), ROUTE)
    url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}
    assert request.messages[0] == {"role": "user", "content": [{"type": "text", "text": "what is this?"}, url]}
    # chat tool messages hold text only: the tool's image follows in a user message
    assert request.messages[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "screenshot"},
        {"role": "user", "content": [url]},
    ]


def test_params_tool_choice_and_ignored_fields() -> None:
    request = CODEC.decode(
        body(
            temperature=0.5,
            top_p=0.9,
            top_k=20,
            stop_sequences=["END"],
            metadata={"user_id": "u"},
            stream=True,
            tools=[
                BASH,
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                {"type": "bash_20250124", "name": "bash"},
            ],
            tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
            thinking={"type": "adaptive"},
            context_management={"edits": []},
            output_config={"effort": "high"},
        ),
        ROUTE,
    )
    assert request.stream is True and request.model == "claude-x"
    assert request.params == {
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["END"],
        "parallel_tool_calls": False,
    }
    assert [t["function"]["name"] for t in request.tools or []] == ["Bash"]
    assert request.tool_choice == {"type": "function", "function": {"name": "Bash"}}
    for kind, expected in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert CODEC.decode(body(tools=[BASH], tool_choice={"type": kind}), ROUTE).tool_choice == expected
    only_server = CODEC.decode(
        body(tools=[{"type": "web_search_20250305", "name": "w"}], tool_choice={"type": "any"}), ROUTE
    )
    assert only_server.tools is None and only_server.tool_choice is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"model": 3}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"tool_choice": {"type": "sometimes"}, "tools": [BASH]}, "tool_choice"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
    ],
)
def test_malformed_requests_say_what_is_wrong(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        CODEC.decode(body(**fields), ROUTE)


def test_count_tokens_needs_no_max_tokens() -> None:
    request = CODEC.decode_count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, ROUTE)
    assert request.params == {} and request.messages == [{"role": "user", "content": "hi"}]
    assert CODEC.count_tokens_body(7) == {"input_tokens": 7}


def test_encode_blocks_order_and_stop_reasons() -> None:
    request = ChatRequest(model="claude-x", messages=[])
    gen = generation(
        {
            "content": "Let me look.",
            "reasoning_content": "Think.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        "tool_calls",
    )
    answer = CODEC.encode(gen, request)
    assert answer["content"] == [
        {"type": "thinking", "thinking": "Think.", "signature": sign_thinking("Think.")},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_a", "name": "Bash", "input": {"command": "ls"}},
    ]
    assert answer["stop_reason"] == "tool_use" and answer["stop_sequence"] is None
    assert answer["id"].startswith("msg_") and answer["type"] == "message" and answer["model"] == "claude-x"
    assert answer["usage"] == {
        "input_tokens": 3,
        "output_tokens": 2,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert CODEC.encode(generation({"content": "x"}, "length"), request)["stop_reason"] == "max_tokens"
    empty = CODEC.encode(generation({"content": None}), request)
    assert empty["content"] == [{"type": "text", "text": ""}] and empty["stop_reason"] == "end_turn"


def test_thinking_signature_round_trips_unchanged() -> None:
    request = ChatRequest(model="m", messages=[])
    block = CODEC.encode(generation({"content": "4", "reasoning_content": "2+2=4"}), request)["content"][0]
    history = body(
        messages=[
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "thanks"},
        ]
    )
    assert CODEC.decode(history, ROUTE).messages[1] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "2+2=4",
    }
    assert CODEC.encode(generation({"content": "4", "reasoning_content": "2+2=4"}), request)["content"][0] == block


def test_stream_event_order() -> None:
    request = ChatRequest(model="claude-x", messages=[], stream=True)
    long_text = "word " * 200
    gen = generation(
        {
            "content": long_text,
            "reasoning_content": "Hmm.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}
            ],
        },
        "tool_calls",
    )
    frames = parse_sse(b"".join(CODEC.stream(gen, request)))
    names = [name for name, _ in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 3
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in frames[2:-2]:
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "_events": []}
        elif name == "content_block_delta":
            blocks[data["index"]]["_events"].append(data["delta"])
        else:
            assert name == "content_block_stop"
    assert [b["type"] for b in blocks.values()] == ["thinking", "text", "tool_use"]
    thinking, text, tool = (blocks[i]["_events"] for i in range(3))
    assert [d["type"] for d in thinking] == ["thinking_delta", "signature_delta"]
    assert thinking[-1]["signature"] == sign_thinking("Hmm.")
    assert len(text) > 1 and "".join(d["text"] for d in text) == long_text
    assert orjson.loads("".join(d["partial_json"] for d in tool)) == {"command": "ls"}
    assert frames[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert frames[-2][1]["usage"]["output_tokens"] == 2


def test_errors_are_provider_shaped() -> None:
    assert CODEC.error_body(401, "bad key") == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "bad key"},
    }
    types = {s: CODEC.error_body(s, "m")["error"]["type"] for s in (400, 404, 429, 500, 502, 529)}
    assert types == {
        400: "invalid_request_error",
        404: "not_found_error",
        429: "rate_limit_error",
        500: "api_error",
        502: "api_error",
        529: "overloaded_error",
    }
    [(name, data)] = parse_sse(CODEC.stream_error(500, "boom"))
    assert name == "error" and data["error"] == {"type": "api_error", "message": "boom"}
