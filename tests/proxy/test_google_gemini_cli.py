"""Request bodies gemini CLI 0.61.0 really sent (fixtures/google, long texts shortened) through the codec and proxy.

Captured by driving ``gemini -p ... -m gemini-2.5-pro`` through one shell call and a final answer against
``polar proxy``. Turn 1 echoes the model turn without its thought part, with this proxy's sealed signature on the
text part and ``thoughtSignature: "skip_thought_signature_validator"`` added to the functionCall part.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.harnesses.install import harness_root
from polar_cli.proxy.codecs.base import Route
from polar_cli.proxy.codecs.google import GoogleCodec

FIXTURES = Path(__file__).parent / "fixtures" / "google"
CODEC = GoogleCodec()
MODEL = "gemini-2.5-pro"
ROUTE = Route(
    path=f"/v1beta/models/{MODEL}:streamGenerateContent",
    query={"alt": "sse"},
    model=MODEL,
    action="streamGenerateContent",
)


def load(turn: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"gemini-cli-0.61.0-turn{turn}.json").read_text())
    return data


def test_turns_normalize_and_extend_each_other() -> None:
    first, second = CODEC.decode(load(0), ROUTE), CODEC.decode(load(1), ROUTE)
    assert first.stream and first.model == MODEL and first.messages[0]["role"] == "system"
    assert first.params == {"temperature": 1, "top_p": 0.95, "top_k": 64}  # thinkingConfig ignored
    assert first.tools is not None and len(first.tools) == 16 and first.tools == second.tools
    assert second.messages[: len(first.messages)] == first.messages
    assistant, tool = second.messages[len(first.messages) :]
    # the CLI dropped the thought text; the sealed signature brought it back
    assert assistant["reasoning_content"] == "I need to create the file with a shell command."
    assert assistant["content"] == "Creating the file."
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == "run_shell_command" and tool["tool_call_id"] == call["id"]
    assert json.loads(tool["content"])["output"].startswith("<untrusted_context>")


def test_calls_without_server_ids_match_their_responses() -> None:
    # a server that sends no functionCall.id: the CLI invents one on both sides, or sends none at all
    for call_id in ("run_shell_command-1763000000000-0a1b2c", None):
        body = copy.deepcopy(load(1))
        call_part, response_part = body["contents"][1]["parts"][1], body["contents"][2]["parts"][0]
        for part in (call_part["functionCall"], response_part["functionResponse"]):
            part.pop("id")
            if call_id:
                part["id"] = call_id
        messages = CODEC.decode(body, ROUTE).messages
        [call] = messages[-2]["tool_calls"]
        assert messages[-1]["tool_call_id"] == call["id"] == (call_id or "call_1_1")


def test_proxy_answers_in_the_shape_gemini_cli_needs(proxy: Any) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "run_shell_command", "arguments": {"command": "ls"}},
    }
    session = proxy.new_session(script=[{"reasoning_content": "Plan.", "content": "Listing.", "tool_calls": [call]}])
    url = f"{session.google_base}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    with httpx.Client(timeout=30) as http:
        answer = http.post(url, json=load(0), headers={"x-goog-api-key": session.api_key})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in answer.text.split("\n\n") if f]
    assert all(f.startswith("data: {") for f in frames)  # no [DONE], no event lines
    chunks = [json.loads(f[6:]) for f in frames]
    for chunk in chunks:  # gemini CLI's isValidResponse: a candidate with non-empty parts, no empty text part
        parts = chunk["candidates"][0]["content"]["parts"]
        assert parts and all(part and (part.get("thought") or part.get("text", "x") != "") for part in parts)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and "usageMetadata" in chunks[-1]
    assert [p["functionCall"]["name"] for p in chunks[-1]["candidates"][0]["content"]["parts"]] == ["run_shell_command"]
    assert len(session.completions()) == 1


def gemini_binary() -> Path | None:
    configured = os.environ.get("POLAR_GEMINI_BIN")
    if configured:
        return Path(configured)
    installed = sorted(harness_root().glob("gemini_cli-*/bin/gemini"))
    if installed:
        return installed[-1]
    found = shutil.which("gemini")
    return Path(found) if found else None


@pytest.mark.e2e
@pytest.mark.harness
def test_real_gemini_cli_round_trips_function_call_and_thought(proxy: Any, tmp_path: Path) -> None:
    """gemini CLI itself, offline, through a shell call and a final answer; reasoning returns via the signature."""
    binary = gemini_binary()
    if binary is None:
        pytest.skip("gemini CLI is not installed (run .ci/setup_harnesses.sh or set POLAR_GEMINI_BIN)")
    arguments = {"command": "echo hello > hello.txt", "description": "create it"}
    call = {"id": "call_e2e", "function": {"name": "run_shell_command", "arguments": arguments}}
    session = proxy.new_session(
        script=[
            {"reasoning_content": "A shell call.", "content": "Creating it.", "tool_calls": [call]},
            {"content": "Done."},
        ]
    )
    home, work = tmp_path / "gemini-home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True)
    work.mkdir()
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    env = {
        **os.environ,
        "GEMINI_CLI_HOME": str(home),
        "GEMINI_API_KEY": session.api_key,
        "GOOGLE_GEMINI_BASE_URL": session.google_base,
        "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    argv = [str(binary), "-p", "create hello.txt", "--yolo", "--skip-trust", "-m", MODEL]
    result = subprocess.run(
        argv, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert (work / "hello.txt").read_text() == "hello\n" and "Done." in result.stdout
    first, second = session.completions()
    assert second["request_messages"][: len(first["request_messages"])] == first["request_messages"]
    assistant, tool = second["request_messages"][len(first["request_messages"]) :]
    assert assistant["reasoning_content"] == "A shell call." and assistant["tool_calls"][0]["id"] == "call_e2e"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_e2e"
