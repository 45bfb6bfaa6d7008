"""OpenAI Responses codec: decoding real Codex CLI bodies, and Response encoding checked with the SDK types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response

from polar_cli.errors import ProtocolError
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.codecs.base import Route
from polar_cli.proxy.codecs.common import seal_thought, stable_id, unseal_thought
from polar_cli.proxy.codecs.openai_responses import OpenAIResponsesCodec
from polar_cli.proxy.codecs.openai_responses_tools import custom_arguments, custom_input

# Bodies Codex CLI 0.169.0 really sent (captured with a logging server; long developer texts shortened).
FIXTURES = Path(__file__).parent / "fixtures" / "openai_responses"
ROUTE = Route(path="/v1/responses")
PATCH = "*** Begin Patch\n*** Add File: second.txt\n+second line\n*** End Patch\n"
codec = OpenAIResponsesCodec()
GEN_ID = "chatcmpl-abcdef0123456789abcd"
BASE = stable_id("", GEN_ID)  # the id stem of every item of that generation


def codex_turn(n: int) -> dict[str, Any]:
    return json.loads((FIXTURES / f"codex-0.169-turn{n}.json").read_text())


def decode(body: dict[str, Any]) -> ChatRequest:
    return codec.decode(body, ROUTE)


def generation(message: dict[str, Any], finish: str = "stop", gen_id: str = GEN_ID) -> Generation:
    return Generation(
        id=gen_id,
        model="served",
        message={"role": "assistant", **message},
        finish_reason=finish,
        prompt_ids=[1, 2, 3, 4],
        response_ids=[5, 6, 7],
        created=1_700_000_000,
    )


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- decode: Codex ------------------------------------------------------------------------------------------------


def test_codex_first_turn_merges_developer_items_into_one_leading_system_message() -> None:
    body = codex_turn(0)
    request = decode(body)
    developer = [p["text"] for i in body["input"] if i.get("role") == "developer" for p in i["content"]]
    assert len(developer) == 4  # two developer items, the second with three text blocks
    assert request.messages[0] == {"role": "system", "content": "\n\n".join(developer)}
    assert [m["role"] for m in request.messages] == ["system", "user", "user"]
    assert request.messages[-1] == {"role": "user", "content": "create hello.txt and second.txt"}
    assert request.model == "gpt-5.5" and request.stream is True
    assert request.params == {"parallel_tool_calls": True}
    assert request.tool_choice == "auto"
    assert request.context["encrypted_reasoning"] is True


def test_codex_tools_become_chat_function_tools_and_apply_patch_stays_callable() -> None:
    request = decode(codex_turn(0))
    assert request.tools is not None
    names = [t["function"]["name"] for t in request.tools]
    assert "exec_command" in names and "apply_patch" in names
    assert "web_search" not in names  # hosted tools are dropped
    assert "tool_search" in names and request.context["tool_search"] is True  # Codex runs this one itself
    assert all(t["type"] == "function" for t in request.tools)
    patch_tool = next(t["function"] for t in request.tools if t["function"]["name"] == "apply_patch")
    assert patch_tool["parameters"]["required"] == ["input"]
    assert patch_tool["parameters"]["properties"]["input"]["type"] == "string"
    assert "*** Begin Patch" in patch_tool["description"]  # the lark grammar travels in the description
    assert set(request.context["custom_tools"]) == {"apply_patch"}
    exec_tool = next(t["function"] for t in request.tools if t["function"]["name"] == "exec_command")
    assert exec_tool["parameters"]["required"] == ["cmd"]


def test_codex_history_with_reasoning_function_and_custom_calls() -> None:
    messages = decode(codex_turn(2)).messages
    assert [m["role"] for m in messages] == ["system", "user", "user", "assistant", "tool", "assistant", "tool"]
    first, second = messages[3], messages[5]
    assert first["content"] is None
    assert first["reasoning_content"] == "I should create the file with a shell command."  # unsealed exactly
    assert first["tool_calls"] == [call("call_a1", "exec_command", '{"cmd": "echo hi > hello.txt"}')]
    assert messages[4]["tool_call_id"] == "call_a1" and messages[4]["content"].startswith("Chunk ID")
    assert second["content"] == "Now patching."
    assert second["reasoning_content"] == "Next, add a second file with apply_patch."
    assert second["tool_calls"] == [call("call_b2", "apply_patch", custom_arguments(PATCH))]
    assert messages[6] == {"role": "tool", "tool_call_id": "call_b2", "content": codex_turn(2)["input"][-1]["output"]}


def test_codex_tool_search_round_trip_loads_namespaced_tools() -> None:
    body = json.loads((FIXTURES / "codex-0.169-tool-search.json").read_text())
    request = decode(body)
    names = [t["function"]["name"] for t in request.tools or []]
    assert set(names[-3:]) == {"spawn_agent", "resume_agent", "close_agent"}  # loaded by the tool_search_output
    assert request.context["namespaced"]["close_agent"] == "multi_agent_v1"
    search, found, close, result = request.messages[-4:]
    assert search["tool_calls"] == [call("call_ts", "tool_search", '{"query": "close agent", "limit": 3}')]
    assert found["role"] == "tool" and found["tool_call_id"] == "call_ts" and "multi_agent_v1" in found["content"]
    assert close["tool_calls"] == [call("call_ca", "close_agent", '{"target": "nobody"}')]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_ca"
    answer = generation({"content": None, "tool_calls": [call("c1", "tool_search", '{"query": "spawn"}')]})
    out = codec.encode(answer, request)["output"]
    assert out == [
        {
            "id": f"tsc_{BASE}_0",
            "type": "tool_search_call",
            "status": "completed",
            "call_id": "c1",
            "execution": "client",
            "arguments": {"query": "spawn"},
        }
    ]
    out = codec.encode(generation({"content": None, "tool_calls": [call("c2", "close_agent", "{}")]}), request)
    assert out["output"][0]["namespace"] == "multi_agent_v1"
    Response.model_validate(out)


def test_codex_turns_extend_each_other() -> None:
    turns = [decode(codex_turn(n)).messages for n in range(3)]
    assert turns[1][: len(turns[0])] == turns[0]
    assert turns[2][: len(turns[1])] == turns[1]


# --- decode: items ------------------------------------------------------------------------------------------------


def test_string_input_and_instructions() -> None:
    request = decode({"model": "m", "instructions": "be brief", "input": "hello"})
    assert request.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert request.tools is None and request.tool_choice is None


def test_system_and_developer_text_merges_after_instructions_in_order() -> None:
    request = decode(
        {
            "model": "m",
            "instructions": "I",
            "input": [
                {"role": "developer", "content": "D1"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "U"}]},
                {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "S"}]},
            ],
        }
    )
    assert request.messages == [{"role": "system", "content": "I\n\nD1\n\nS"}, {"role": "user", "content": "U"}]


def test_consecutive_calls_merge_and_reasoning_opens_the_next_turn() -> None:
    request = decode(
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "user", "content": "go"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "doing"}]},
                {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "b", "arguments": '{"x":1}'},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "more"}]},
                {"type": "function_call", "call_id": "c3", "name": "a", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "r1"},
                {"type": "function_call_output", "call_id": "c2", "output": "r2"},
                {"type": "function_call_output", "call_id": "c3", "output": "r3"},
                {"type": "message", "role": "assistant", "content": "done"},
            ],
        }
    )
    messages = request.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "tool", "tool", "tool", "assistant"]
    assert messages[1] == {
        "role": "assistant",
        "content": "doing",
        "reasoning_content": "plan",
        "tool_calls": [call("c1", "a", "{}"), call("c2", "b", '{"x":1}')],
    }
    assert messages[2] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "more",
        "tool_calls": [call("c3", "a", "{}")],
    }
    assert messages[-1] == {"role": "assistant", "content": "done"}


def test_tool_output_parts_and_images() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    request = decode(
        {
            "model": "m",
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}],
                },
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"}, image]},
            ],
        }
    )
    assert request.messages[1] == {"role": "tool", "tool_call_id": "c1", "content": "one\ntwo"}
    assert request.messages[2]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


def test_unknown_items_are_mapped_or_dropped_without_failing() -> None:
    request = decode(
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "user", "content": "hi"},
                {
                    "type": "web_search_call",
                    "id": "ws_1",
                    "status": "completed",
                    "action": {"type": "search", "query": "q"},
                },
                {
                    "type": "local_shell_call",
                    "id": "lsc_1",
                    "call_id": "c9",
                    "status": "completed",
                    "action": {"type": "exec", "command": ["ls"]},
                },
                {"type": "local_shell_call_output", "call_id": "c9", "output": "file.txt"},
                {"type": "item_reference", "id": "msg_old"},
                {"type": "compaction", "encrypted_content": "opaque"},
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-foreign-blob"},
            ],
        }
    )
    assert request.messages == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("c9", "local_shell_call", json.dumps({"action": {"type": "exec", "command": ["ls"]}}))],
        },
        {"role": "tool", "tool_call_id": "c9", "content": "file.txt"},
    ]


def test_reasoning_encrypted_content_round_trips_and_foreign_values_are_ignored() -> None:
    text = "Long chain of thought.\n\nWith ünïcode and two paragraphs."
    sealed = seal_thought(text)
    assert sealed == seal_thought(text)  # deterministic
    assert unseal_thought(sealed) == text
    assert unseal_thought(sealed[:-8] + ("A" if sealed[-9] != "A" else "B") + sealed[-7:]) is None  # tampered
    assert unseal_thought("gAAAAB-openai-blob") is None

    def reasoning_of(item: dict[str, Any]) -> Any:
        messages = decode(
            {
                "model": "m",
                "input": [
                    {"type": "message", "role": "user", "content": "q"},
                    item,
                    {"type": "message", "role": "assistant", "content": "a"},
                ],
            }
        ).messages
        return messages[1].get("reasoning_content")

    # the seal wins over a summary that a client shortened
    assert (
        reasoning_of(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}], "encrypted_content": sealed}
        )
        == text
    )
    assert (
        reasoning_of(
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "visible"}],
                "encrypted_content": "foreign",
            }
        )
        == "visible"
    )
    assert (
        reasoning_of({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "raw"}]})
        == "raw"
    )


def test_custom_input_recovers_the_freeform_text() -> None:
    assert custom_input(custom_arguments(PATCH)) == PATCH
    assert custom_input('{"patch": "P"}') == "P"  # a model that named the parameter itself
    assert custom_input("*** Begin Patch\nraw") == "*** Begin Patch\nraw"  # raw text instead of JSON
    assert custom_input('"quoted"') == "quoted"
    assert custom_input('{"a": "x", "b": "y"}') == '{"a": "x", "b": "y"}'


def test_namespace_tools_are_flattened_and_calls_carry_the_namespace() -> None:
    body = {
        "model": "m",
        "input": "spawn",
        "tools": [
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "description": "agents",
                "tools": [
                    {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}},
                    {"type": "custom", "name": "note"},
                ],
            },
            {"type": "web_search"},
            {"type": "mcp", "server_label": "x"},
        ],
    }
    request = decode(body)
    assert [t["function"]["name"] for t in request.tools or []] == ["spawn_agent", "note"]
    assert request.context["namespaced"] == {"spawn_agent": "multi_agent_v1", "note": "multi_agent_v1"}
    out = codec.encode(
        generation({"content": None, "tool_calls": [call("c1", "spawn_agent", "{}")]}, "tool_calls"), request
    )["output"]
    assert out[0]["type"] == "function_call" and out[0]["namespace"] == "multi_agent_v1"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
        ({"type": "custom", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
        ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]}, "required"),
        ({"type": "web_search_preview"}, "auto"),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    assert decode({"model": "m", "input": "x", "tools": tools, "tool_choice": choice}).tool_choice == expected


def test_sampling_params_and_text_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = decode(
        {
            "model": "m",
            "input": "x",
            "max_output_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.9,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
            "reasoning": {"effort": "high"},
            "store": False,
            "prompt_cache_key": "k",
            "service_tier": "auto",
            "some_future_field": {"x": 1},
        }
    )
    assert request.params == {
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}},
    }


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ([], "JSON object"),
        ({"input": "x"}, "'model'"),
        ({"model": "m", "input": 5}, "'input'"),
        ({"model": "m", "input": ["text"]}, "input[0]"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"model": "m", "input": [{"type": "message", "role": "user", "content": [{"type": "video"}]}]}, "video"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m", "input": "x", "tools": {"type": "function"}}, "'tools'"),
    ],
)
def test_malformed_requests_are_protocol_errors(body: Any, needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        decode(body)


# --- encode -------------------------------------------------------------------------------------------------------


def test_encode_full_response_validates_against_the_sdk_types() -> None:
    request = decode(codex_turn(0))
    message = {
        "content": "Patching now.",
        "reasoning_content": "think first",
        "tool_calls": [
            call("call_x", "apply_patch", custom_arguments(PATCH)),
            call("call_y", "exec_command", '{"cmd":"ls"}'),
        ],
    }
    body = codec.encode(generation(message, "tool_calls"), request)
    response = Response.model_validate(body, strict=False)
    assert response.id == "resp_" + BASE and body["object"] == "response"
    assert response.status == "completed" and response.model == "gpt-5.5"
    assert [item.type for item in response.output] == ["reasoning", "message", "custom_tool_call", "function_call"]
    reasoning, text, custom, function = body["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "think first"}]
    assert unseal_thought(reasoning["encrypted_content"]) == "think first"
    assert text["content"] == [{"type": "output_text", "text": "Patching now.", "annotations": [], "logprobs": []}]
    assert text["role"] == "assistant" and text["status"] == "completed"
    assert custom == {
        "id": f"ctc_{BASE}_0",
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "call_x",
        "name": "apply_patch",
        "input": PATCH,
    }
    assert function["arguments"] == '{"cmd":"ls"}' and function["call_id"] == "call_y"
    assert body["usage"] == {
        "input_tokens": 4,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    assert body["tools"] == codex_turn(0)["tools"] and body["parallel_tool_calls"] is True


def test_encoded_output_decodes_back_to_the_same_assistant_message() -> None:
    request = decode(codex_turn(0))
    message = {
        "content": "Patching now.",
        "reasoning_content": "line one\n\nline two",
        "tool_calls": [
            call("call_x", "apply_patch", custom_arguments(PATCH)),
            call("call_y", "exec_command", '{"cmd":"ls"}'),
        ],
    }
    output = codec.encode(generation(message, "tool_calls"), request)["output"]
    echoed = decode({**codex_turn(0), "input": [*codex_turn(0)["input"], *output]}).messages[-1]
    assert echoed == {"role": "assistant", **message}


def test_encode_without_encrypted_reasoning_unless_included() -> None:
    request = decode({"model": "m", "input": "x"})
    body = codec.encode(generation({"content": "a", "reasoning_content": "r"}), request)
    assert "encrypted_content" not in body["output"][0]
    Response.model_validate(body)


def test_encode_length_is_incomplete() -> None:
    body = codec.encode(generation({"content": "cut of"}, "length"), decode({"model": "m", "input": "x"}))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    Response.model_validate(body)


def test_encode_empty_answer_still_has_a_message() -> None:
    body = codec.encode(generation({"content": None}), decode({"model": "m", "input": "x"}))
    assert [item["type"] for item in body["output"]] == ["message"]
    assert body["output"][0]["content"][0]["text"] == ""
    Response.model_validate(body)


def test_tool_calls_only_have_no_message_item() -> None:
    body = codec.encode(
        generation({"content": "", "tool_calls": [call("c", "f", "{}")]}, "tool_calls"),
        decode({"model": "m", "input": "x"}),
    )
    assert [item["type"] for item in body["output"]] == ["function_call"]


def test_error_bodies() -> None:
    assert codec.error_body(400, "bad input") == {
        "error": {"message": "bad input", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert codec.error_body(401, "no")["error"]["code"] == "invalid_api_key"
    assert codec.error_body(503, "down")["error"] == {
        "message": "down",
        "type": "server_error",
        "param": None,
        "code": "server_error",
    }
    overflow = codec.error_body(400, "This model's maximum context length is 4096 tokens")
    assert overflow["error"]["code"] == "context_length_exceeded"
    assert codec.count_tokens_body(12) == {"object": "response.input_tokens", "input_tokens": 12}
