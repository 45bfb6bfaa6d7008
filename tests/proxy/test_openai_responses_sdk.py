"""The official ``openai`` SDK's Responses API against the real proxy (scripted backend, demo tokenizer).

Every answer and stream event is parsed by the SDK with strict response validation; every generation call leaves
exactly one Completion in the session's journal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    "strict": False,
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
}
FIXTURES = Path(__file__).parent / "fixtures" / "openai_responses"


_clients: list[OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Every SDK client a test made is closed after it (warnings are errors, leaked sockets too)."""
    yield
    while _clients:
        _clients.pop().close()


def client(session: Any) -> OpenAI:
    sdk = OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0, _strict_response_validation=True)
    _clients.append(sdk)
    return sdk


def tool_turn(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def test_text_answer_non_streaming(proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Hello there."}])
    response = client(session).responses.create(model="demo", instructions="Be brief.", input="hi")
    assert response.output_text == "Hello there."
    assert response.status == "completed" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and response.usage.output_tokens > 0
    [record] = session.completions()
    assert record["provider"] == "openai_responses"
    assert record["request_messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert response.usage.input_tokens == len(record["prompt_ids"])
    assert response.usage.output_tokens == len(record["response_ids"])


def test_text_answer_streaming_events_are_sdk_typed(proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "Streamed words.", "reasoning_content": "Short thought."}])
    stream = client(session).responses.create(model="demo", input="hi", stream=True)
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Streamed words."
    summary = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert "".join(summary) == "Short thought."
    final = events[-1].response
    assert final.output_text == "Streamed words." and final.id == events[0].response.id
    assert len(session.completions()) == 1


def test_stream_helper_accumulates_the_final_response(proxy: Any) -> None:
    session = proxy.new_session(
        script=[{"content": "Via the helper."}, tool_turn("call_1", "exec_command", {"cmd": "ls"})]
    )
    sdk = client(session)
    with sdk.responses.stream(model="demo", input="hi") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Via the helper." and final.output_text == "Via the helper."
    with sdk.responses.stream(model="demo", input="run ls", tools=[EXEC]) as stream:  # type: ignore[list-item]
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and call.name == "exec_command" and json.loads(call.arguments) == {"cmd": "ls"}
    assert len(session.completions()) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_round_trip(proxy: Any, stream: bool) -> None:
    session = proxy.new_session(
        script=[
            {"reasoning_content": "List the files first.", **tool_turn("call_ls", "exec_command", {"cmd": "ls"})},
            {"content": "There is one file."},
        ]
    )
    sdk = client(session)
    history: list[Any] = [{"role": "user", "content": "what files are here?"}]
    first = _create(sdk, stream, input=history, tools=[EXEC], include=["reasoning.encrypted_content"])
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    assert call.call_id == "call_ls" and json.loads(call.arguments) == {"cmd": "ls"}
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "notes.txt"})
    second = _create(sdk, stream, input=history, tools=[EXEC], include=["reasoning.encrypted_content"])
    assert second.output_text == "There is one file."
    records = session.completions()
    assert len(records) == 2
    assistant, tool = records[1]["request_messages"][1:3]
    function = {"name": "exec_command", "arguments": call.arguments}  # echoed byte-identical
    assert assistant == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "List the files first.",  # restored from encrypted_content
        "tool_calls": [{"id": "call_ls", "type": "function", "function": function}],
    }
    assert tool == {"role": "tool", "tool_call_id": "call_ls", "content": "notes.txt"}
    first_prompt = records[0]["prompt_ids"]
    assert records[1]["prompt_ids"][: len(first_prompt)] == first_prompt  # the second prompt extends the first


@pytest.mark.parametrize("stream", [False, True])
def test_custom_tool_round_trip(proxy: Any, stream: bool) -> None:
    session = proxy.new_session(
        script=[tool_turn("call_patch", "apply_patch", {"input": PATCH}), {"content": "Patched."}]
    )
    sdk = client(session)
    history: list[Any] = [{"role": "user", "content": "create hello.txt"}]
    first = _create(sdk, stream, input=history, tools=[EXEC, APPLY_PATCH])
    [call] = first.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == PATCH
    history += [call.model_dump(exclude_none=True)]
    history.append({"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"})
    second = _create(sdk, stream, input=history, tools=[EXEC, APPLY_PATCH])
    assert second.output_text == "Patched."
    records = session.completions()
    assert len(records) == 2
    patch_tool = next(t for t in records[0]["request_tools"] if t["function"]["name"] == "apply_patch")
    assert patch_tool["function"]["parameters"]["required"] == ["input"]
    assistant = records[1]["request_messages"][1]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}


def test_codex_request_bodies_are_answered_as_codex_needs(proxy: Any) -> None:
    """Replay what Codex CLI 0.169.0 sent, raw, and check the SSE it gets back event by event."""
    session = proxy.new_session(script=[{"content": "ok"}] * 3)
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    headers = {"Authorization": f"Bearer {session.api_key}", "Accept": "text/event-stream"}
    for n in range(3):
        body = json.loads((FIXTURES / f"codex-0.169-turn{n}.json").read_text())
        reply = httpx.post(f"{session.openai_base}/responses", json=body, headers=headers, timeout=30)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in reply.text.split("\n\n") if f]
        events = []
        for frame in frames:
            event_line, data_line = frame.split("\n")
            data = json.loads(data_line.removeprefix("data: "))
            assert event_line == f"event: {data['type']}"
            events.append(adapter.validate_python(data))
        assert events[-1].type == "response.completed" and events[-1].response.id
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [item.type for item in done] == ["message"]
    assert len(session.completions()) == 3


def test_errors_are_openai_shaped_and_record_nothing(proxy: Any) -> None:
    session = proxy.new_session(script=[{"content": "never"}])
    other = proxy.new_session(script=[{"content": "never"}])
    intruder = OpenAI(base_url=session.openai_base, api_key=other.api_key, max_retries=0)
    with intruder, pytest.raises(openai.AuthenticationError) as denied:
        intruder.responses.create(model="demo", input="hi")
    assert denied.value.status_code == 401
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client(session).responses.create(model="demo", input="hi", previous_response_id="resp_1")
    assert session.completions() == [] and other.completions() == []


def test_backend_failure_reaches_the_client(proxy: Any) -> None:
    session = proxy.new_session(script=[{"error": {"status": 500, "message": "scripted failure"}}])
    with pytest.raises(openai.InternalServerError, match="scripted failure"):
        client(session).responses.create(model="demo", input="hi", stream=True)
    assert session.completions() == []


def _create(sdk: OpenAI, stream: bool, **kwargs: Any) -> Any:
    """One ``responses.create`` call; the streamed variant returns the Response of ``response.completed``."""
    if not stream:
        return sdk.responses.create(model="demo", **kwargs)
    events = list(sdk.responses.create(model="demo", stream=True, **kwargs))
    assert events[-1].type == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.model_dump() for item in done] == [item.model_dump() for item in events[-1].response.output]
    return events[-1].response
