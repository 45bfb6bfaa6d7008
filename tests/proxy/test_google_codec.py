"""Unit tests of the Google Gemini codec: request normalization, answers, stream chunks, errors, signatures."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_cli.errors import ProtocolError
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.codecs import detect, get_codec
from polar_cli.proxy.codecs.base import Route
from polar_cli.proxy.codecs.common import seal_thought, unseal_thought
from polar_cli.proxy.codecs.google import GoogleCodec
from polar_cli.proxy.codecs.google_input import openapi_to_json_schema

CODEC = GoogleCodec()
ROUTE = Route(path="/v1beta/models/gemini-x:generateContent", model="gemini-x", action="generateContent")
STREAM_ROUTE = Route(
    path="/v1beta/models/gemini-x:streamGenerateContent",
    query={"alt": "sse"},
    model="gemini-x",
    action="streamGenerateContent",
)
SHELL = {
    "name": "run_shell_command",
    "description": "Run a command.",
    "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def body(**fields: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], **fields}


def generation(message: dict[str, Any], finish: str = "stop") -> Generation:
    return Generation(
        id="chatcmpl-1",
        model="m",
        message={"role": "assistant", **message},
        finish_reason=finish,
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
    )


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if frame:
            assert frame.startswith("data: ") and "\n" not in frame  # no event lines, no [DONE]
            out.append(orjson.loads(frame[6:]))
    return out


def test_detection_routes() -> None:
    found = detect("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", {}, {"alt": "sse"})
    assert (found.kind, found.provider, found.route.model, found.route.action) == (
        "generate",
        "google",
        "gemini-2.5-pro",
        "streamGenerateContent",
    )
    assert detect("POST", "/v1beta/models/g:countTokens", {}, {}).kind == "count_tokens"
    assert isinstance(get_codec("google"), GoogleCodec)


def test_decode_system_params_and_stream_flag() -> None:
    request = CODEC.decode(
        body(
            systemInstruction={"parts": [{"text": "Be brief."}, {"text": "Be kind."}]},
            generationConfig={
                "temperature": 0.3,
                "topP": 0.9,
                "topK": 40,
                "maxOutputTokens": 100,
                "seed": 7,
                "stopSequences": ["END"],
                "candidateCount": 1,
                "thinkingConfig": {"includeThoughts": True, "thinkingBudget": -1},
            },
            safetySettings=[{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        ),
        STREAM_ROUTE,
    )
    assert request.stream is True and request.model == "gemini-x"
    assert request.messages == [{"role": "system", "content": "Be brief.\nBe kind."}, {"role": "user", "content": "hi"}]
    assert request.params == {
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 40,
        "max_tokens": 100,
        "seed": 7,
        "stop": ["END"],
    }
    assert CODEC.decode(body(systemInstruction="Plain."), ROUTE).messages[0] == {"role": "system", "content": "Plain."}
    snake = CODEC.decode(
        body(system_instruction={"parts": [{"text": "S"}]}, generation_config={"max_output_tokens": 5}), ROUTE
    )
    assert snake.messages[0]["content"] == "S" and snake.params == {"max_tokens": 5}


def test_function_call_round_trip_with_cli_made_ids_and_skip_signature() -> None:
    # what gemini CLI sends back: its own functionCall.id and the skip signature on the call part
    contents = [
        {"role": "user", "parts": [{"text": "make hello.txt"}]},
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "id": "run_shell_command-1763-abc",
                        "name": "run_shell_command",
                        "args": {"command": "touch hello.txt"},
                    },
                    "thoughtSignature": "skip_thought_signature_validator",
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "run_shell_command-1763-abc",
                        "name": "run_shell_command",
                        "response": {"output": "done"},
                    }
                }
            ],
        },
    ]
    request = CODEC.decode(body(contents=contents, tools=[{"functionDeclarations": [SHELL]}]), ROUTE)
    assert request.messages[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("run_shell_command-1763-abc", "run_shell_command", '{"command":"touch hello.txt"}')],
        },
        {"role": "tool", "tool_call_id": "run_shell_command-1763-abc", "content": '{"output":"done"}'},
    ]
    assert request.tools == [
        {
            "type": "function",
            "function": {
                "name": "run_shell_command",
                "description": "Run a command.",
                "parameters": SHELL["parametersJsonSchema"],
            },
        }
    ]


def test_calls_without_ids_get_deterministic_ids_matched_by_name_then_order() -> None:
    contents = [
        {"role": "user", "parts": [{"text": "go"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Two calls."},
                {"functionCall": {"name": "a", "args": {}}},
                {"functionCall": {"name": "b", "args": {"x": 1}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "b", "response": {"r": 2}}},
                {"functionResponse": {"name": "zzz", "response": {"r": 1}}},
                {"text": "continue"},
            ],
        },
    ]
    first = CODEC.decode(body(contents=contents), ROUTE).messages
    assert [c["id"] for c in first[1]["tool_calls"]] == ["call_1_1", "call_1_2"]
    assert [m.get("tool_call_id") for m in first[2:]] == ["call_1_2", "call_1_1", None]
    assert first[4] == {"role": "user", "content": "continue"}
    assert CODEC.decode(body(contents=contents), ROUTE).messages == first  # same request, same ids


def test_thoughts_and_sealed_signatures_restore_reasoning() -> None:
    sealed = seal_thought("I will list files.")
    with_text = [{"text": "I will list files.", "thought": True}, {"text": "Listing.", "thoughtSignature": sealed}]
    contents = [{"role": "user", "parts": [{"text": "q"}]}, {"role": "model", "parts": with_text}]
    assert CODEC.decode(body(contents=contents), ROUTE).messages[1] == {
        "role": "assistant",
        "content": "Listing.",
        "reasoning_content": "I will list files.",
    }
    # the CLI dropped the thought part but kept the signature: the reasoning comes back from it
    urlsafe = base64.urlsafe_b64encode(base64.b64decode(sealed)).decode()  # google-genai re-encodes URL-safe
    dropped = [
        {"role": "user", "parts": [{"text": "q"}]},
        {"role": "model", "parts": [{"text": "Listing.", "thoughtSignature": urlsafe}]},
    ]
    assert CODEC.decode(body(contents=dropped), ROUTE).messages[1]["reasoning_content"] == "I will list files."


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_seal_round_trips_and_rejects_foreign(text: str) -> None:
    assert unseal_thought(seal_thought(text)) == text
    assert unseal_thought("skip_thought_signature_validator") is None
    assert unseal_thought(base64.b64encode(b"polar-ts1:" + b"0" * 32 + text.encode()).decode()) in (None, text)


def test_openapi_schema_becomes_json_schema() -> None:
    schema = {
        "type": "OBJECT",
        "propertyOrdering": ["a"],
        "required": ["a"],
        "properties": {
            "a": {"type": "STRING", "enum": ["x", "y"], "nullable": True},
            "b": {"type": "ARRAY", "items": {"type": "INTEGER", "format": "int32"}, "maxItems": 3},
            "c": {"anyOf": [{"type": "NUMBER"}, {"type": "BOOLEAN"}]},
        },
    }
    assert openapi_to_json_schema(schema) == {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": ["string", "null"], "enum": ["x", "y"]},
            "b": {"type": "array", "items": {"type": "integer", "format": "int32"}, "maxItems": 3},
            "c": {"anyOf": [{"type": "number"}, {"type": "boolean"}]},
        },
    }


def test_tools_tool_config_and_response_schema() -> None:
    tools = [
        {"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT", "properties": {}}}, SHELL]},
        {"googleSearch": {}},
        {"codeExecution": {}},
    ]
    request = CODEC.decode(body(tools=tools, toolConfig={"functionCallingConfig": {"mode": "ANY"}}), ROUTE)
    assert [t["function"]["name"] for t in request.tools or []] == ["f", "run_shell_command"]
    assert request.tools and request.tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert request.tool_choice == "required"
    forced = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}}
    assert CODEC.decode(body(tools=tools, toolConfig=forced), ROUTE).tool_choice == {
        "type": "function",
        "function": {"name": "f"},
    }
    assert (
        CODEC.decode(body(tools=tools, toolConfig={"functionCallingConfig": {"mode": "NONE"}}), ROUTE).tool_choice
        == "none"
    )
    assert CODEC.decode(body(tools=[{"googleSearch": {}}]), ROUTE).tools is None
    config = {"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT", "properties": {}}}
    assert CODEC.decode(body(generationConfig=config), ROUTE).params["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": {"type": "object", "properties": {}}},
    }
    plain = CODEC.decode(body(generationConfig={"responseMimeType": "application/json"}), ROUTE)
    assert plain.params["response_format"] == {"type": "json_object"}


def test_inline_images() -> None:
    parts = [
        {"text": "what?"},
        {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/"}},
        {"inlineData": {"mimeType": "audio/wav", "data": "UklG"}},
    ]
    request = CODEC.decode(body(contents=[{"role": "user", "parts": parts}]), ROUTE)
    assert request.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what?"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
            ],
        }
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "role"),
        ({"generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({"generationConfig": {"temperature": "hot"}}, "temperature"),
        ({"tools": [{"functionDeclarations": [{"description": "no name"}]}]}, "name"),
        (
            {
                "tools": [{"functionDeclarations": [SHELL]}],
                "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}},
            },
            "mode",
        ),
    ],
)
def test_malformed_requests_say_what_is_wrong(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        CODEC.decode(body(**fields), ROUTE)


def test_count_tokens_bodies() -> None:
    count_route = Route(path="/v1beta/models/gemini-x:countTokens", model="gemini-x", action="countTokens")
    direct = CODEC.decode_count_tokens(body(), count_route)
    wrapped = CODEC.decode_count_tokens({"generateContentRequest": {"model": "models/gemini-x", **body()}}, count_route)
    assert direct.messages == wrapped.messages == [{"role": "user", "content": "hi"}]
    assert CODEC.decode_count_tokens({"contents": []}, count_route).messages == []
    assert CODEC.count_tokens_body(9) == {"totalTokens": 9}


def test_encode_parts_order_signature_and_finish() -> None:
    request = ChatRequest(model="gemini-x", messages=[])
    gen = generation(
        {
            "content": "Creating it.",
            "reasoning_content": "Need a file.",
            "tool_calls": [call("call_a", "run_shell_command", '{"command":"touch a"}')],
        },
        "tool_calls",
    )
    answer = CODEC.encode(gen, request)
    candidate = answer["candidates"][0]
    assert candidate["finishReason"] == "STOP" and candidate["index"] == 0
    assert candidate["content"]["parts"] == [
        {"text": "Need a file.", "thought": True},
        {"text": "Creating it.", "thoughtSignature": seal_thought("Need a file.")},
        {"functionCall": {"id": "call_a", "name": "run_shell_command", "args": {"command": "touch a"}}},
    ]
    assert answer["usageMetadata"] == {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5}
    assert answer["modelVersion"] == "gemini-x" and answer["responseId"]
    assert (
        CODEC.encode(generation({"content": "x"}, "length"), request)["candidates"][0]["finishReason"] == "MAX_TOKENS"
    )
    # the answer decodes back to the same assistant message (reasoning restored even without the thought part)
    history = [{"role": "user", "parts": [{"text": "q"}]}, candidate["content"]]
    assert CODEC.decode(body(contents=history), ROUTE).messages[1] == gen.message | {"content": "Creating it."}


def test_stream_chunks_are_valid_and_last_carries_finish() -> None:
    request = ChatRequest(model="gemini-x", messages=[], stream=True)
    text = "token " * 100
    gen = generation(
        {
            "content": text,
            "reasoning_content": "Plan.",
            "tool_calls": [call("c1", "f", '{"a":1}'), call("c2", "g", "{}")],
        },
        "tool_calls",
    )
    chunks = parse_sse(b"".join(CODEC.stream(gen, request)))
    parts = [c["candidates"][0]["content"]["parts"] for c in chunks]
    # every piece goes out as it comes, and no frame before the last has an empty part (gemini CLI skips those)
    assert all(p and all(part.get("text") != "" for part in p) for p in parts[:-1])
    assert parts[0] == [{"text": "Plan.", "thought": True}]
    assert parts[1][0]["thoughtSignature"] == seal_thought("Plan.")
    assert "".join(p[0]["text"] for p in parts[1:-1]) == text and len(parts) > 3
    assert [p["functionCall"]["name"] for p in parts[-1]] == ["f", "g"]
    assert all("finishReason" not in c["candidates"][0] and "usageMetadata" not in c for c in chunks[:-1])
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and chunks[-1]["usageMetadata"]["totalTokenCount"] == 5
    # an answer without calls ends like Gemini's own stream: a last {text: ""} frame with the finish and the usage
    first, last = parse_sse(b"".join(CODEC.stream(generation({"content": "Hi"}), request)))
    head, tail = first["candidates"][0], last["candidates"][0]
    assert head["content"]["parts"] == [{"text": "Hi"}] and "finishReason" not in head
    assert tail["content"]["parts"] == [{"text": ""}] and tail["finishReason"] == "STOP"
    # a thought with nothing after it: the signature rides on that last part
    thought, end = parse_sse(b"".join(CODEC.stream(generation({"reasoning_content": "Hm."}), request)))
    assert thought["candidates"][0]["content"]["parts"] == [{"text": "Hm.", "thought": True}]
    assert end["candidates"][0]["content"]["parts"] == [{"text": "", "thoughtSignature": seal_thought("Hm.")}]


def test_errors_are_provider_shaped() -> None:
    assert CODEC.error_body(401, "bad key") == {
        "error": {"code": 401, "message": "bad key", "status": "UNAUTHENTICATED"}
    }
    statuses = {s: CODEC.error_body(s, "m")["error"]["status"] for s in (400, 429, 500, 502, 503)}
    assert statuses == {
        400: "INVALID_ARGUMENT",
        429: "RESOURCE_EXHAUSTED",
        500: "INTERNAL",
        502: "INTERNAL",
        503: "UNAVAILABLE",
    }
    assert parse_sse(CODEC.stream_error(500, "boom")) == [
        {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}
    ]
