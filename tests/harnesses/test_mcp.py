"""MCP servers and skills (``agent.config.mcp_servers`` / ``skills``): the validation of the shared model, the config
each adapter writes in its CLI's own format, and real sessions whose scripted model calls the tool of a tiny MCP server
(tests/harnesses/mcp_echo_server.py, the real ``mcp`` package) through the real CLIs."""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar_cli.errors import ConfigError
from polar_cli.harnesses.testing import check_run, polar_run_file
from polar_cli.interfaces.harness import HarnessContext
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.registry import LOAD_ENV, get_harness, reset_registry
from tests.harnesses.test_polar_run import need_cli

SERVER = str(Path(__file__).with_name("mcp_echo_server.py"))
MCP_HARNESSES = ["claude_code", "codex", "gemini_cli", "qwen_code", "opencode"]


@pytest.fixture(autouse=True)
def _with_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """claude_code and codex live in their plugin packages (installed by .ci/run)."""
    monkeypatch.setenv(LOAD_ENV, "claude-code,codex")
    reset_registry()
    yield
    reset_registry()


def context(config: dict[str, Any]) -> HarnessContext:
    return HarnessContext(
        instruction="hi",
        model="served-model",
        api_key="sk-session",
        base_urls={
            "openai": "http://127.0.0.1:9/s/a/v1",
            "anthropic": "http://127.0.0.1:9/s/a",
            "google": "http://127.0.0.1:9/s/a",
        },
        home="/polar/home",
        workdir="/polar/session",
        tools="/polar/tools",
        config=config,
    )


CONFIG: dict[str, Any] = {
    "mcp_servers": {
        "polar": {"command": "python3", "args": ["/srv/echo.py", "--flag"], "env": {"LOG": "/polar/home/log"}},
    },
    "skills": {
        "greet": {"description": "How to greet: say hello", "instructions": "Say hello.", "files": {"ref/a.md": "A"}},
    },
}
STDIO = {"command": "python3", "args": ["/srv/echo.py", "--flag"], "env": {"LOG": "/polar/home/log"}}


def files_of(name: str, config: dict[str, Any] = CONFIG) -> tuple[Any, dict[str, str]]:
    launch = get_harness(name).launch(context(config))
    return launch, launch.files


def check_skill(files: dict[str, str], folder: str) -> None:
    text = files[f"{folder}/greet/SKILL.md"]
    front, body = text.removeprefix("---\n").split("---\n", 1)
    assert yaml.safe_load(front) == {"name": "greet", "description": "How to greet: say hello"}
    assert body.strip() == "Say hello."
    assert files[f"{folder}/greet/ref/a.md"] == "A"


def test_claude_code_writes_an_mcp_config_file_and_waits_for_its_servers() -> None:
    launch, files = files_of("claude_code")
    assert json.loads(files[".claude/mcp.json"]) == {
        "mcpServers": {"polar": {"type": "stdio", **STDIO, "env": STDIO["env"]}}
    }
    at = launch.argv.index("--mcp-config")
    assert launch.argv[at + 1 : at + 3] == ["/polar/home/.claude/mcp.json", "--strict-mcp-config"]
    assert launch.env["MCP_CONNECT_TIMEOUT_MS"] == "30000" and launch.env["MCP_CONNECTION_NONBLOCKING"] == "0"
    check_skill(files, ".claude/skills")
    plain, plain_files = files_of("claude_code", {})
    assert "--mcp-config" not in plain.argv and "MCP_TIMEOUT" not in plain.env and plain_files == {}


def test_codex_writes_required_mcp_server_tables() -> None:
    _, files = files_of("codex")
    config = tomllib.loads(files[".codex/config.toml"])
    assert config["mcp_servers"] == {"polar": {**STDIO, "startup_timeout_sec": 30.0, "required": True}}
    check_skill(files, ".codex/skills")


@pytest.mark.parametrize(("name", "folder"), [("gemini_cli", ".gemini"), ("qwen_code", ".qwen")])
def test_gemini_and_qwen_write_mcp_servers_into_settings(name: str, folder: str) -> None:
    _, files = files_of(name)
    settings = json.loads(files[f"{folder}/settings.json"])
    assert settings["mcpServers"] == {"polar": STDIO}
    assert settings["telemetry"] == {"enabled": False}  # the adapter's own settings stay
    check_skill(files, f"{folder}/skills")


def test_opencode_writes_a_local_mcp_entry() -> None:
    _, files = files_of("opencode")
    config = json.loads(files[".config/opencode/opencode.json"])
    assert config["mcp"] == {
        "polar": {
            "type": "local",
            "command": ["python3", "/srv/echo.py", "--flag"],
            "environment": STDIO["env"],
            "enabled": True,
            "timeout": 30000,
        }
    }
    check_skill(files, ".config/opencode/skills")


def test_pi_takes_skills_but_has_no_mcp_client() -> None:
    _, files = files_of("pi", {"skills": CONFIG["skills"]})
    check_skill(files, ".pi/agent/skills")
    with pytest.raises(ConfigError, match="unknown config mcp_servers"):
        get_harness("pi").check_config(CONFIG)


def test_user_settings_still_win() -> None:
    config = {**CONFIG, "settings": {"mcpServers": {"polar": {"trust": True}}}}
    _, files = files_of("gemini_cli", config)
    assert json.loads(files[".gemini/settings.json"])["mcpServers"]["polar"] == {**STDIO, "trust": True}


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"url": "https://mcp.example.com/mcp"}, "remote server (url): only local stdio servers"),
        ({"type": "sse", "command": "x"}, "remote server"),
        ({"command": "bin/server"}, "program name found on the runtime's PATH or an absolute path"),
        ({"command": "/opt/../etc/x"}, "absolute path in the runtime, not '/opt/../etc/x'"),
        ({"command": "python3 -m x"}, "absolute path in the runtime"),
        ({"command": ""}, "absolute path in the runtime, not ''"),
        ({"command": "x", "args": ["$HOME/a"]}, "must be literal, not '$HOME/a'"),
        ({"command": "x", "args": ["{file:~/.ssh/id_rsa}"]}, "must be literal"),
        ({"command": "x", "env": {"A": "${SECRET}"}}, "config mcp_servers.s.env.A must be literal"),
        ({"command": "x", "env": {"A B": "1"}}, "'A B' is not an environment variable name"),
        ({"command": "x", "args": ["a\0b"]}, "must not contain a NUL character"),
        ({"command": "x", "startup_timeout_seconds": 0}, "startup_timeout_seconds"),
        ({"command": "x", "cwd": "/"}, "unknown config mcp_servers.s.cwd"),
    ],
)
def test_bad_mcp_servers_are_refused_naming_the_field(server: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="harness 'qwen_code'") as info:
        get_harness("qwen_code").check_config({"mcp_servers": {"s": server}})
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("gemini_cli", {"mcpServers": {"evil": {"command": "x"}}}, "settings.mcpServers.evil adds 'evil'"),
        ("codex", {"mcp_servers": {"evil": {"url": "https://x"}}}, "config mcp_servers must declare every MCP server"),
        ("opencode", {"mcp": {"s": {"type": "remote", "url": "https://x"}}}, "settings.mcp.s makes 's' remote"),
        ("qwen_code", {"mcpServers": {"s": {"httpUrl": "https://x"}}}, "settings.mcpServers.s makes 's' remote"),
        ("claude_code", {"mcpServers": []}, "not settings.mcpServers (not a mapping)"),
    ],
)
def test_settings_cannot_add_an_mcp_server_or_make_one_remote(name: str, settings: Any, message: str) -> None:
    config = {"mcp_servers": {"s": {"command": "x"}}, "settings": settings}
    with pytest.raises(ConfigError) as info:
        get_harness(name).check_config(config)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mcp_servers": {"bad name": {"command": "x"}}}, "'bad name' is not a server name"),
        ({"skills": {"Bad_Name": {"description": "d"}}}, "'Bad_Name' is not a skill name"),
        ({"skills": {"s": {"description": ""}}}, "config skills.s.description"),
        ({"skills": {"s": {"description": "d", "files": {"../x": "a"}}}}, "'../x' is not a relative path"),
        ({"skills": {"s": {"description": "d", "files": {"/etc/x": "a"}}}}, "'/etc/x' is not a relative path"),
        ({"skills": {"s": {"description": "d", "files": {"a/./b": "a"}}}}, "is not a relative path"),
        ({"skills": {"s": {"description": "d", "files": {"SKILL.md": "a"}}}}, "SKILL.md is written from"),
        ({"skills": {"s": {"description": "d", "instructions": "x" * 1_000_001}}}, "a skill holds at most"),
    ],
)
def test_bad_names_and_skill_paths_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        get_harness("claude_code").check_config(config)
    assert message in str(info.value)


def test_the_documented_example_is_a_valid_config() -> None:
    """docs/harnesses.md, "MCP servers and skills": its YAML is accepted by every adapter that runs MCP servers."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "harnesses.md").read_text()
    block = text.split("## MCP servers and skills", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    config = yaml.safe_load(block)["agent"]["config"]
    for name in MCP_HARNESSES:
        get_harness(name).check_config(config)
    assert "release-notes/templates/notes.md" in "".join(files_of("opencode", config)[1])


# --- real sessions: the scripted model calls the tiny MCP server's tool through each CLI -------------------------

# The name each CLI gives the tool polar_echo of the server "polar" (the name the model calls).
TOOL_NAMES = {
    "claude_code": "mcp__polar__polar_echo",
    "gemini_cli": "mcp_polar_polar_echo",
    "opencode": "polar_polar_echo",
    "qwen_code": "mcp__polar__polar_echo",
    "codex": "polar_echo",  # the function polar_echo of the Responses namespace tool mcp__polar
}


@pytest.mark.harness
@pytest.mark.parametrize("name", sorted(TOOL_NAMES))
def test_the_scripted_model_calls_a_tiny_mcp_servers_tool_through_the_real_cli(tmp_path: Path, name: str) -> None:
    """The server (started by the CLI inside the local runtime) logs the call; the tool's answer reaches the next
    request; the session completes with traces that verify. A skill is installed too: its description reaches the
    model."""
    need_cli(name)
    log, marker = tmp_path / "mcp.log", f"polar-mcp-{name}"
    call = {
        "id": "call_polar_mcp_1",
        "type": "function",
        "function": {"name": TOOL_NAMES[name], "arguments": json.dumps({"text": marker})},
    }
    task = {
        "task_id": f"mcp-{name}",
        "instruction": "Call the polar_echo tool, then say that you are done.",
        "timeout_seconds": 300,
        "runtime": {"backend": "local"},
        "agent": {
            "harness": name,
            "model_name": "polar-test",
            "config": {
                "mcp_servers": {
                    "polar": {
                        "command": sys.executable,
                        "args": [SERVER],
                        "env": {"POLAR_MCP_LOG": str(log)},
                        "startup_timeout_seconds": 120,
                    }
                },
                "skills": {
                    "polar-greeting": {
                        "description": "PolarSkillMarker: greet the Polar way",
                        "instructions": "Say POLAR.",
                    }
                },
            },
        },
        "builder": {"strategy": "prefix_merging"},
        "evaluator": {"strategy": "session_completion"},
        "metadata": {
            SCRIPT_KEY: [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "assistant", "content": "The echo is done."},
            ]
        },
    }
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(task), encoding="utf-8")
    report = polar_run_file(task_file, tmp_path)[0]
    assert log.is_file() and log.read_text().splitlines() == [marker], report.describe()
    check_run(report)
    first, second = report.completions[0], report.completions[1]
    assert "PolarSkillMarker" in json.dumps(first.request), "the skill's description is not in the first request"
    assert f"polar-mcp-echo: {marker}" in json.dumps(second.request), "the tool's answer is not in the next request"
