"""OpenAI Responses synthetic stream: exact event order, sequence numbers, and SDK-typed events."""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.codecs.base import Route
from polar_cli.proxy.codecs.openai_responses import OpenAIResponsesCodec
from polar_cli.proxy.codecs.openai_responses_tools import custom_arguments

codec = OpenAIResponsesCodec()
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}, "strict": False},
    {"type": "custom", "name": "apply_patch", "description": "edit files", "format": {"type": "text"}},
]


def request(**extra: Any) -> ChatRequest:
    body = {"model": "gpt-5.5", "input": "go", "tools": TOOLS, "stream": True, **extra}
    return codec.decode(body, Route(path="/v1/responses"))


def generation(message: dict[str, Any], finish: str = "stop") -> Generation:
    return Generation(
        id="chatcmpl-feedfacefeedface0001",
        model="served",
        message={"role": "assistant", **message},
        finish_reason=finish,
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        created=1_700_000_000,  # fixed, as a backend's answer has it: else stream and JSON read the clock apart
    )


def frames(raw: list[bytes]) -> list[dict[str, Any]]:
    """Parse SSE frames; each must be ``event: <type>`` + one ``data:`` line whose JSON has the same type."""
    out = []
    text = b"".join(raw).decode()
    assert text.endswith("\n\n") and "[DONE]" not in text
    for frame in text.split("\n\n")[:-1]:
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[len("data: ") :])
        assert data["type"] == event_line[len("event: ") :]
        EVENTS.validate_python(data)  # every event is a valid SDK-typed event
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def test_full_stream_event_order() -> None:
    message = {
        "content": "Hello.",
        "reasoning_content": "Think.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'}},
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "apply_patch", "arguments": custom_arguments("PATCH")},
            },
        ],
    }
    gen, req = generation(message, "tool_calls"), request(include=["reasoning.encrypted_content"])
    events = frames(list(codec.stream(gen, req)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = codec.encode(gen, req)
    created, completed = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["id"] == final["id"]
    assert completed == final  # the terminal event carries the same Response as the JSON answer
    Response.model_validate(completed)
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["item"] for e in done] == final["output"]  # output_item.done items are complete and authoritative
    assert [e["output_index"] for e in done] == [0, 1, 2, 3]
    by_type = {e["type"]: e for e in events}
    assert by_type["response.output_text.delta"]["delta"] == "Hello."
    assert by_type["response.output_text.done"]["text"] == "Hello."
    assert by_type["response.reasoning_summary_text.done"]["text"] == "Think."
    assert by_type["response.function_call_arguments.done"]["arguments"] == '{"cmd":"ls"}'
    assert by_type["response.custom_tool_call_input.done"]["input"] == "PATCH"
    assert by_type["response.custom_tool_call_input.delta"]["item_id"] == final["output"][3]["id"]


def test_long_texts_stream_as_several_deltas() -> None:
    text, arguments = "word " * 300, '{"cmd": "' + "x" * 700 + '"}'
    calls = [{"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": arguments}}]
    events = frames(list(codec.stream(generation({"content": text, "tool_calls": calls}, "tool_calls"), request())))
    texts = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    args = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(texts) > 1 and "".join(texts) == text
    assert len(args) > 1 and "".join(args) == arguments


def test_text_only_stream() -> None:
    events = frames(list(codec.stream(generation({"content": "Hi"}), request())))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert added["status"] == "in_progress" and added["content"] == [] and added["role"] == "assistant"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hi"


def test_length_ends_with_response_incomplete() -> None:
    events = frames(list(codec.stream(generation({"content": "cut"}, "length"), request())))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert all(e["type"] != "response.completed" for e in events)


def test_stream_error_is_created_then_failed() -> None:
    events = frames([codec.stream_error(502, "backend unavailable")])
    assert [e["type"] for e in events] == ["response.created", "response.failed"]
    failed = events[1]["response"]
    assert failed["id"] == events[0]["response"]["id"] and failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "backend unavailable"}
    Response.model_validate(failed)


def test_tool_search_call_has_only_added_and_done() -> None:
    search = {"type": "tool_search", "execution": "client", "parameters": {"type": "object", "properties": {}}}
    req = request(tools=[*TOOLS, search])
    calls = [{"id": "c1", "type": "function", "function": {"name": "tool_search", "arguments": '{"query": "x"}'}}]
    events = frames(list(codec.stream(generation({"content": None, "tool_calls": calls}, "tool_calls"), req)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[3]["item"]["type"] == "tool_search_call" and events[3]["item"]["arguments"] == {"query": "x"}
