"""Request bodies Claude Code 2.1.197 really sent (fixtures/anthropic, texts shortened) through the codec and proxy.

Captured by driving ``claude -p`` through one Bash call and a final answer against ``polar proxy`` (see
docs/providers.md), once with ``--model claude-sonnet-4-5`` (thinking enabled) and once with an unknown model name
(``thinking: adaptive``, ``output_config`` and a ``role: "system"`` message inside ``messages``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.harnesses.install import harness_root
from polar_cli.proxy.codecs.anthropic import AnthropicCodec
from polar_cli.proxy.codecs.base import Route

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"
VARIANTS = ["claude-2.1.197-sonnet", "claude-2.1.197-unknown-model"]
CODEC = AnthropicCodec()
ROUTE = Route(path="/v1/messages", query={"beta": "true"})


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


@pytest.mark.parametrize("variant", VARIANTS)
def test_turns_normalize_and_extend_each_other(variant: str) -> None:
    first, second = CODEC.decode(load(f"{variant}-turn0"), ROUTE), CODEC.decode(load(f"{variant}-turn1"), ROUTE)
    assert first.stream and second.stream
    system = first.messages[0]
    assert system["role"] == "system" and "x-anthropic-billing-header" not in system["content"]
    assert [m["role"] for m in first.messages].count("system") == 1
    # cache_control moved between the turns, the billing line changed: the normalized prompts still extend
    assert second.messages[: len(first.messages)] == first.messages
    assistant, tool = second.messages[len(first.messages) :]
    assert assistant["reasoning_content"] == "The user wants a file. I will use Bash."
    [call] = assistant["tool_calls"]
    assert call["function"] == {
        "name": "Bash",
        "arguments": '{"command":"echo hello > hello.txt","description":"Create hello.txt"}',
    }
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": "(Bash completed with no output)"}
    assert first.tools is not None and len(first.tools) == 24 and first.tools == second.tools
    assert first.params == {"max_tokens": 32000}


def test_count_tokens_body_of_a_real_request() -> None:
    body = load("claude-2.1.197-sonnet-turn0")
    body.pop("max_tokens")
    request = CODEC.decode_count_tokens(body, Route(path="/v1/messages/count_tokens"))
    assert request.messages == CODEC.decode(load("claude-2.1.197-sonnet-turn0"), ROUTE).messages


def sse_frames(text: str) -> list[tuple[str, dict[str, Any]]]:
    frames = []
    for frame in text.split("\n\n"):
        if frame:
            event, data = frame.split("\n")
            assert event.startswith("event: ")  # Claude Code ignores frames without a named event
            frames.append((event[7:], json.loads(data[6:])))
    return frames


@pytest.mark.parametrize("variant", VARIANTS)
def test_proxy_answers_in_the_shape_claude_code_needs(proxy: Any, variant: str) -> None:
    call = {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
    session = proxy.new_session(script=[{"reasoning_content": "Plan.", "tool_calls": [call]}, {"content": "Done."}])
    headers = {
        "x-api-key": session.api_key,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,context-management-2025-06-27,interleaved-thinking-2025-05-14",
    }
    url = f"{session.anthropic_base}/v1/messages?beta=true"
    with httpx.Client(timeout=30) as http:
        assert http.head(session.anthropic_base).status_code == 200  # Claude Code's start-up probe
        first = http.post(url, json=load(f"{variant}-turn0"), headers=headers)
        second = http.post(url, json=load(f"{variant}-turn1"), headers=headers)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(first.text)
    names = [name for name, _ in frames]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    starts = [data["content_block"] for name, data in frames if name == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "tool_use"]
    assert names.count("content_block_stop") == 2  # without it Claude Code cannot parse the tool call
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"
    texts = [d["delta"]["text"] for n, d in sse_frames(second.text) if n == "content_block_delta"]
    assert "".join(texts) == "Done."  # pass-through: in the upstream's pieces
    assert len(session.completions()) == 2


def claude_binary() -> Path | None:
    configured = os.environ.get("POLAR_CLAUDE_BIN")
    if configured:
        return Path(configured)
    installed = sorted(harness_root().glob("claude_code-*/bin/claude"))
    if installed:
        return installed[-1]
    found = shutil.which("claude")
    return Path(found) if found else None


@pytest.mark.e2e
@pytest.mark.harness
def test_real_claude_code_round_trips_tool_call_and_thinking(proxy: Any, tmp_path: Path) -> None:
    """Claude Code itself, offline, through one Bash call and a final answer; its thinking must come back intact."""
    binary = claude_binary()
    if binary is None:
        pytest.skip("Claude Code is not installed (run .ci/setup_harnesses.sh or set POLAR_CLAUDE_BIN)")
    call = {"id": "toolu_e2e", "function": {"name": "Bash", "arguments": {"command": "echo hello > hello.txt"}}}
    session = proxy.new_session(
        script=[
            {"reasoning_content": "Use Bash.", "content": "Creating it.", "tool_calls": [call]},
            {"content": "Done."},
        ]
    )
    config, work = tmp_path / "claude-config", tmp_path / "work"
    config.mkdir()
    work.mkdir()
    env = {
        **os.environ,
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CONFIG_DIR": str(config),
        "ANTHROPIC_BASE_URL": session.anthropic_base,
        "ANTHROPIC_API_KEY": session.api_key,
        "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    argv = [str(binary), "-p", "create hello.txt", "--dangerously-skip-permissions", "--model", "claude-sonnet-4-5"]
    result = subprocess.run(
        argv, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert (work / "hello.txt").read_text() == "hello\n" and "Done." in result.stdout
    first, second = session.completions()
    assert "x-anthropic-billing-header" not in first["request_messages"][0]["content"]
    assert second["request_messages"][: len(first["request_messages"])] == first["request_messages"]
    assistant, tool = second["request_messages"][len(first["request_messages"]) :]
    assert assistant["reasoning_content"] == "Use Bash." and assistant["tool_calls"][0]["id"] == "toolu_e2e"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "toolu_e2e"
