"""The official ``google-genai`` SDK against the real proxy (scripted backend, demo tokenizer).

Every answer and stream chunk is parsed by the SDK; every generation call leaves exactly one Completion in the
session's journal and ``countTokens`` leaves none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google import genai
from google.genai import errors, types

SHELL = types.FunctionDeclaration(
    name="run_shell_command",
    description="Run a shell command.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={"command": types.Schema(type=types.Type.STRING), "timeout": types.Schema(type=types.Type.INTEGER)},
        required=["command"],
    ),
)
SHELL_JSON = types.FunctionDeclaration(
    name="run_shell_command",
    description="Run a shell command.",
    parameters_json_schema={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
)
NO_AFC = types.AutomaticFunctionCallingConfig(disable=True)


@pytest.fixture
def client() -> Iterator[Callable[..., genai.Client]]:
    """``client(session, api_key=None)``: an SDK client pointed at a session; every client is closed afterwards."""
    made: list[genai.Client] = []

    def make(session: Any, api_key: str | None = None) -> genai.Client:
        sdk = genai.Client(
            api_key=api_key or session.api_key,
            http_options=types.HttpOptions(
                base_url=session.google_base, retry_options=types.HttpRetryOptions(attempts=1)
            ),
        )
        made.append(sdk)
        return sdk

    yield make
    for sdk in made:
        sdk.close()


def shell_turn(call_id: str, command: str, **extra: Any) -> dict[str, Any]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "run_shell_command", "arguments": {"command": command}},
    }
    return {"tool_calls": [call], **extra}


def test_text_answer_non_streaming(client: Callable[..., genai.Client], proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Hello there."}])
    config = types.GenerateContentConfig(
        system_instruction="Be brief.", temperature=0.2, max_output_tokens=64, stop_sequences=["END"], seed=3
    )
    response = client(session).models.generate_content(model="gemini-x", contents="hi", config=config)
    assert response.text == "Hello there." and response.model_version == "gemini-x"
    assert response.candidates and response.candidates[0].finish_reason == types.FinishReason.STOP
    [record] = session.completions()
    assert record["provider"] == "google" and record["metadata"]["stream"] is False
    assert record["request_messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert record["request_params"] == {"temperature": 0.2, "max_tokens": 64, "stop": ["END"], "seed": 3}
    usage = response.usage_metadata
    assert usage is not None and usage.prompt_token_count == len(record["prompt_ids"])
    assert usage.candidates_token_count == len(record["response_ids"])


def test_text_answer_streaming(client: Callable[..., genai.Client], proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Streamed " * 80}])
    chunks = list(client(session).models.generate_content_stream(model="gemini-x", contents="hi"))
    assert len(chunks) > 1 and "".join(chunk.text or "" for chunk in chunks) == "Streamed " * 80
    assert chunks[-1].candidates and chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata is not None and chunks[-1].usage_metadata.total_token_count
    [record] = session.completions()
    assert record["metadata"]["stream"] is True


@pytest.mark.parametrize("streaming", [False, True])
def test_function_call_round_trip(client: Callable[..., genai.Client], proxy: Any, streaming: bool) -> None:
    script = [shell_turn("call_01", "touch hello.txt", reasoning_content="A shell call will do."), {"content": "Done."}]
    session = proxy.new_session(script=script)
    sdk = client(session)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[SHELL_JSON if streaming else SHELL])],
        tool_config=types.ToolConfig(
            function_calling_config=types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.AUTO)
        ),
        automatic_function_calling=NO_AFC,
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="create hello.txt")])]

    def generate() -> types.Content:
        if not streaming:
            response = sdk.models.generate_content(model="gemini-x", contents=contents, config=config)  # type: ignore[arg-type]
            assert response.candidates and response.candidates[0].content
            return response.candidates[0].content
        parts: list[types.Part] = []
        for chunk in sdk.models.generate_content_stream(model="gemini-x", contents=contents, config=config):  # type: ignore[arg-type]
            assert chunk.candidates and chunk.candidates[0].content
            parts.extend(chunk.candidates[0].content.parts or [])
        return types.Content(role="model", parts=parts)

    model_turn = generate()
    parts = model_turn.parts or []
    thought = "".join(p.text or "" for p in parts if p.thought)  # pass-through streams the thought in pieces
    assert parts[0].thought is True and thought == "A shell call will do."
    calls = [part.function_call for part in parts if part.function_call]
    assert len(calls) == 1 and calls[0].name == "run_shell_command" and calls[0].id == "call_01"
    assert calls[0].args == {"command": "touch hello.txt"}
    assert any(part.thought_signature for part in parts[1:])
    # like gemini CLI: send the model turn back without its thought part, then the function's result
    contents.append(types.Content(role="model", parts=[p for p in parts if not p.thought]))
    result = types.FunctionResponse(id=calls[0].id, name=calls[0].name, response={"output": "ok"})
    contents.append(types.Content(role="user", parts=[types.Part(function_response=result)]))
    final = generate()
    assert "".join(part.text or "" for part in final.parts or []) == "Done."
    records = session.completions()
    assert len(records) == 2 and [r["finish_reason"] for r in records] == ["tool_calls", "stop"]
    assert records[1]["request_messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "A shell call will do.",
            "tool_calls": [
                {
                    "id": "call_01",
                    "type": "function",
                    "function": {"name": "run_shell_command", "arguments": '{"command":"touch hello.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_01", "content": '{"output":"ok"}'},
    ]
    parameters = records[0]["request_tools"][0]["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["properties"]["command"] == {"type": "string"}


def test_count_tokens_is_a_side_call(client: Callable[..., genai.Client], proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Counted."}])
    sdk = client(session)
    counted = sdk.models.count_tokens(model="gemini-x", contents="how many tokens?")
    assert session.completions() == []
    response = sdk.models.generate_content(model="gemini-x", contents="how many tokens?")
    assert response.usage_metadata is not None
    assert counted.total_tokens == response.usage_metadata.prompt_token_count
    assert len(session.completions()) == 1


def test_errors_are_typed_by_the_sdk(client: Callable[..., genai.Client], proxy: Any) -> None:
    session = proxy.new_session(script=[{"error": {"status": 500, "message": "backend exploded"}}])
    other = proxy.new_session(script=[{"content": "never"}])
    with pytest.raises(errors.ClientError) as denied:
        client(other, api_key=session.api_key).models.generate_content(model="gemini-x", contents="hi")
    assert denied.value.code == 401 and denied.value.status == "UNAUTHENTICATED"
    two = types.GenerateContentConfig(candidate_count=2)
    with pytest.raises(errors.ClientError, match="candidateCount") as bad:
        client(session).models.generate_content(model="gemini-x", contents="hi", config=two)
    assert bad.value.code == 400 and bad.value.status == "INVALID_ARGUMENT"
    with pytest.raises(errors.ServerError, match="backend exploded"):
        list(client(session).models.generate_content_stream(model="gemini-x", contents="hi"))
    assert session.completions() == [] and other.completions() == []
