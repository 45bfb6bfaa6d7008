"""Request bodies the real harness CLIs sent (tests/fixtures/harness_requests, captured with ``polar doctor
--save-requests``, long texts shortened) go through the real proxy and get the answer shape each CLI needs.

What each CLI needs was measured (shared/HARNESSES.md): codex reads items only from ``response.output_item.done``
and needs ``response.completed`` with an id; Claude Code needs named ``event:`` lines, ``message_start`` first and
``content_block_stop`` after a tool call; the chat CLIs (pi, qwen, opencode, openclaw, nanocoder) need
``finish_reason`` in the stream (grok_cli does not stream: it reads ``choices[0].message``); Gemini CLI needs SSE
``data:`` chunks with ``functionCall`` parts and a ``finishReason``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harness_requests"
FILES = sorted(FIXTURES.glob("*/turn*.json"))
# the harness's own shell tool and its command argument (as in each adapter's doctor_script)
SHELL_TOOLS = {
    "codex": ("exec_command", "cmd"),
    "claude_code": ("Bash", "command"),
    "pi": ("bash", "command"),
    "qwen_code": ("run_shell_command", "command"),
    "gemini_cli": ("run_shell_command", "command"),
    "opencode": ("bash", "command"),
    "cline": ("run_commands", "commands"),
    "kilocode": ("bash", "command"),
    "continue_cli": ("Bash", "command"),
    "openclaw": ("exec", "command"),
    "grok_cli": ("bash", "command"),
    "nanocoder": ("execute_bash", "command"),
    "mini_swe_agent": ("bash", "command"),
    "gptme": ("shell", "command"),
    "hermes": ("terminal", "command"),
}
# harnesses without a shell tool: their turns are text (aider's file edits are in its edit format)
TEXT_ONLY = {"aider": "polar-check.sh\n```\nls\n```\n"}

# the CLIs that make plain (non-streamed) calls; every other measured CLI streams
NOT_STREAMED = {"grok_cli", "mini_swe_agent"}


def sse_events(text: str) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) per SSE event; ``[DONE]`` stays a string."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            joined = "\n".join(data)
            events.append((name, joined if joined == "[DONE]" else json.loads(joined)))
    return events


def answer_for(harness: str, turn: str) -> dict[str, Any]:
    if harness in TEXT_ONLY:
        return {"role": "assistant", "content": TEXT_ONLY[harness] if turn == "turn1" else "Done."}
    if turn == "turn1":
        tool, argument = SHELL_TOOLS[harness]
        call = {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": {argument: "ls"}}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": "Done."}


def headers_for(provider: str, key: str) -> dict[str, str]:
    if provider == "anthropic":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if provider == "google":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


def check_codex(events: list[tuple[str | None, Any]], tool_turn: bool) -> None:
    types = [data["type"] for _, data in events if isinstance(data, dict)]
    assert types[-1] == "response.completed"
    assert events[-1][1]["response"]["id"]
    done_items = [
        data["item"] for _, data in events if isinstance(data, dict) and data["type"] == "response.output_item.done"
    ]
    assert done_items
    if tool_turn:
        assert any(item["type"] == "function_call" and item["name"] == "exec_command" for item in done_items)
    else:
        assert any(item["type"] == "message" for item in done_items)


def check_claude(events: list[tuple[str | None, Any]], tool_turn: bool) -> None:
    assert all(name is not None and name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    if tool_turn:
        starts = [data for name, data in events if name == "content_block_start"]
        tool = next(s for s in starts if s["content_block"]["type"] == "tool_use")
        stops = [data["index"] for name, data in events if name == "content_block_stop"]
        assert tool["index"] in stops
        assert any(
            data.get("delta", {}).get("stop_reason") == "tool_use" for name, data in events if name == "message_delta"
        )


def check_chat(events: list[tuple[str | None, Any]], tool_turn: bool) -> None:
    assert events[-1][1] == "[DONE]"
    chunks = [data for _, data in events if isinstance(data, dict)]
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert reasons[-1] == ("tool_calls" if tool_turn else "stop")
    if tool_turn:
        deltas = [tc for c in chunks if c.get("choices") for tc in c["choices"][0]["delta"].get("tool_calls") or []]
        assert deltas[0]["id"] and deltas[0]["function"]["name"]


def check_google(events: list[tuple[str | None, Any]], tool_turn: bool) -> None:
    chunks = [data for _, data in events]
    parts = [p for c in chunks for cand in c.get("candidates", []) for p in cand.get("content", {}).get("parts", [])]
    reasons = [cand.get("finishReason") for c in chunks for cand in c.get("candidates", []) if cand.get("finishReason")]
    assert reasons
    if tool_turn:
        assert any("functionCall" in p and p["functionCall"]["name"] == "run_shell_command" for p in parts)
    else:
        assert any(p.get("text") for p in parts)


CHECKS = {"openai_responses": check_codex, "anthropic": check_claude, "openai_chat": check_chat, "google": check_google}


def check_chat_json(body: dict[str, Any], tool_turn: bool) -> None:
    """A call made without ``stream`` (mini-SWE-agent's litellm, Grok CLI's headless mode) gets one chat completion."""
    choice = body["choices"][0]
    assert choice["finish_reason"] == ("tool_calls" if tool_turn else "stop")
    if tool_turn:
        assert choice["message"]["tool_calls"][0]["function"]["name"]


def test_fixtures_cover_every_harness() -> None:
    captured = {path.parent.name for path in FILES}
    expected = set(SHELL_TOOLS) | set(TEXT_ONLY)
    assert captured == expected, f"missing: {expected - captured}"


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}-{p.stem}" for p in FILES])
def test_captured_request_is_answered_in_the_shape_the_cli_needs(proxy: Any, path: Path) -> None:
    fixture = json.loads(path.read_text())
    harness, provider = fixture["harness"], fixture["provider"]
    session = proxy.new_session(script=[answer_for(harness, path.stem)])
    base = session.base_urls["anthropic"]  # the session root: every fixture path is relative to it
    response = proxy.http.post(
        base + fixture["path"],
        params=fixture["query"],
        json=fixture["body"],
        headers=headers_for(provider, session.api_key),
    )
    assert response.status_code == 200, response.text
    tool_turn = path.stem == "turn1" and harness not in TEXT_ONLY
    if fixture["stream"]:
        assert response.headers["content-type"].startswith("text/event-stream")
        CHECKS[provider](sse_events(response.text), tool_turn=tool_turn)
    else:  # a plain chat completion
        assert harness in NOT_STREAMED and provider == "openai_chat", f"{harness} was measured streaming"
        check_chat_json(response.json(), tool_turn)
        if tool_turn:
            call = response.json()["choices"][0]["message"]["tool_calls"][0]
            assert call["function"]["name"] == SHELL_TOOLS[harness][0]
    (completion,) = session.completions()
    assert completion["provider"] == provider
    assert completion["request"] == fixture["body"]
    if path.stem == "turn2" and harness not in TEXT_ONLY:  # the tool result the CLI sent back: a tool message
        assert any(m["role"] == "tool" for m in completion["request_messages"])
