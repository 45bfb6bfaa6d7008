"""What each built-in adapter asks for: argv lists, config only in the session home, pinned model, gateway, stdin."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar_cli.errors import ConfigError, HarnessError
from polar_cli.harnesses.npm import ARG_LIMIT, NODE_PACKAGE, NpmHarness
from polar_cli.harnesses.shell import ShellHarness
from polar_cli.interfaces.harness import Harness, HarnessContext, HarnessRun
from polar_cli.registry import get_harness, get_registry

NASTY = "--help \"double\" 'single' $(touch pwned) `touch pwned2`; touch pwned3 \\\nsecond line @file"
BUILTIN = ["cline", "continue_cli", "gemini_cli", "grok_cli", "kilocode", "nanocoder", "openclaw", "opencode", "pi",
           "qwen_code", "shell"]
# built-in too, but a PyPI venv runs only in the local runtime: tests/harnesses/test_pypi_more.py covers them
PYPI_BUILTIN = ["gptme", "hermes"]


def context(**overrides: Any) -> HarnessContext:
    fields: dict[str, Any] = {
        "instruction": NASTY,
        "model": "served-model",
        "api_key": "sk-session-secret",
        "base_urls": {
            "openai": "http://127.0.0.1:9/s/abc/v1",
            "anthropic": "http://127.0.0.1:9/s/abc",
            "google": "http://127.0.0.1:9/s/abc",
        },
        "home": "/polar/home",
        "workdir": "/polar/session",
        "tools": "/polar/tools",
        "session_id": "abc",
    }
    fields.update(overrides)
    return HarnessContext(**fields)


def test_builtins_are_registered() -> None:
    assert get_registry().names("harness") == sorted([*BUILTIN, *PYPI_BUILTIN])


@pytest.mark.parametrize("name", BUILTIN)
def test_launch_shape(name: str) -> None:
    harness = get_harness(name)
    ctx = context(config=harness.doctor_config())
    launch = harness.launch(ctx)
    assert isinstance(launch.argv, list) and all(isinstance(a, str) for a in launch.argv)
    for relative in launch.files:
        assert not relative.startswith("/") and ".." not in relative.split("/")
    # the instruction is never part of a shell string: at most one whole argv element of its own, or stdin/file/env
    carriers = [a for a in launch.argv if NASTY in a]
    if carriers == [NASTY]:  # a positional prompt: the last argument, after "--" (cline) or `run` (nanocoder)
        assert launch.argv[-2] in ("--", "run") and launch.argv[-1] == NASTY, launch.argv
    elif carriers:
        assert carriers == [f"--prompt={NASTY}"], carriers
    else:
        delivered = launch.stdin == NASTY.encode() or NASTY in launch.files.values()
        assert delivered
    assert launch.cwd == ctx.workdir
    if isinstance(harness, NpmHarness) and harness.node_version:  # its own Node runs its entry script
        modules = "/polar/tools/lib/node_modules"
        assert launch.argv[:2] == [
            f"{modules}/{NODE_PACKAGE}/bin/node",
            f"{modules}/{harness.npm_package}/{harness.entry}",
        ]
    elif isinstance(harness, NpmHarness):
        assert launch.argv[0] == f"/polar/tools/bin/{harness.binary}"
    if isinstance(harness, NpmHarness):
        assert launch.env["HOME"] == "/polar/home"
        assert harness.version and harness.npm_package
        # every value pointing at a place is inside the session home or the gateway
        for value in launch.env.values():
            if value.startswith("/"):
                assert value.startswith("/polar/home"), value


@pytest.mark.parametrize("name", BUILTIN)
def test_model_key_and_base_url_are_pinned(name: str) -> None:
    harness = get_harness(name)
    launch = harness.launch(context(config=harness.doctor_config()))
    everything = json.dumps([launch.argv, launch.env, launch.files])
    assert "sk-session-secret" in everything
    assert "http://127.0.0.1:9/s/abc" in everything
    if name not in ("shell", "cline", "continue_cli"):  # those two pin the model only in their config file
        assert any(arg in ("served-model", "polar/served-model") for arg in launch.argv)


def test_qwen_gemini_fall_back_to_stdin_for_huge_instructions() -> None:
    huge = "x" * (ARG_LIMIT + 1)
    for name in ("qwen_code", "gemini_cli"):
        launch = get_harness(name).launch(context(instruction=huge))
        assert launch.stdin == huge.encode()
        assert not any(huge in a for a in launch.argv)


def test_qwen_settings_switch_off_telemetry_and_updates() -> None:
    launch = get_harness("qwen_code").launch(context())
    settings = json.loads(launch.files[".qwen/settings.json"])
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert launch.env["OPENAI_MODEL"] == "served-model"
    assert launch.env["QWEN_HOME"] == "/polar/home/.qwen"


def test_gemini_settings_select_api_key_auth() -> None:
    launch = get_harness("gemini_cli").launch(context(config={"settings": {"ui": {"theme": "x"}}}))
    settings = json.loads(launch.files[".gemini/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["ui"] == {"theme": "x"}  # user settings merged over the adapter's
    assert launch.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9/s/abc"
    assert "--skip-trust" in launch.argv and "--yolo" in launch.argv


def test_pi_models_json_and_api_choice() -> None:
    launch = get_harness("pi").launch(context())
    provider = json.loads(launch.files[".pi/agent/models.json"])["providers"]["polar"]
    assert provider == {
        "baseUrl": "http://127.0.0.1:9/s/abc/v1",
        "api": "openai-completions",
        "apiKey": "sk-session-secret",
        "models": [{"id": "served-model", "name": "served-model"}],
    }
    anthropic = get_harness("pi").launch(context(config={"api": "anthropic-messages"}))
    assert json.loads(anthropic.files[".pi/agent/models.json"])["providers"]["polar"]["baseUrl"].endswith("/s/abc")
    with pytest.raises(ConfigError, match="config api"):
        get_harness("pi").launch(context(config={"api": "google"}))
    with pytest.raises(ConfigError, match="unknown config"):
        get_harness("pi").launch(context(config={"nope": 1}))


def test_opencode_config() -> None:
    launch = get_harness("opencode").launch(context(config={"model_limits": {"context": 8192, "output": 1024}}))
    config = json.loads(launch.files[".config/opencode/opencode.json"])
    assert config["model"] == config["small_model"] == "polar/served-model"
    assert config["agent"]["title"] == {"disable": True}
    assert config["provider"]["polar"]["models"]["served-model"]["limit"] == {"context": 8192, "output": 1024}
    assert launch.env["XDG_CONFIG_HOME"] == "/polar/home/.config"
    assert launch.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"


def test_openclaw_config_pins_its_provider_and_model() -> None:
    launch = get_harness("openclaw").launch(context(config={"model_limits": {"contextWindow": 8192}}))
    config = json.loads(launch.files[".openclaw/openclaw.json"])
    assert config["models"]["mode"] == "replace"
    provider = config["models"]["providers"]["polar"]
    assert provider["baseUrl"] == "http://127.0.0.1:9/s/abc/v1" and provider["api"] == "openai-completions"
    assert provider["models"][0]["id"] == "served-model" and provider["models"][0]["contextWindow"] == 8192
    assert config["agents"]["defaults"]["model"]["primary"] == "polar/served-model"
    assert config["update"]["checkOnStart"] is False and config["telemetry"]["enabled"] is False
    assert launch.argv[2:6] == ["agent", "exec", "--message-file", "-"] and launch.stdin == NASTY.encode()
    assert launch.argv[7:9] == ["--config", "/polar/home/.openclaw/openclaw.json"]
    assert launch.env["OPENCLAW_HOME"] == "/polar/home" and launch.env["OPENCLAW_NO_AUTO_UPDATE"] == "1"


def test_grok_and_nanocoder_config_and_argv_only_instruction() -> None:
    grok = get_harness("grok_cli").launch(context(config={"max_tool_rounds": 7}))
    assert json.loads(grok.files[".grok/user-settings.json"])["baseURL"] == "http://127.0.0.1:9/s/abc/v1"
    assert grok.env["GROK_MODEL"] == "served-model" and grok.argv[-2:] == ["--max-tool-rounds", "7"]
    nano = get_harness("nanocoder").launch(context())
    (provider,) = json.loads(nano.files[".config/nanocoder/agents.config.json"])["nanocoder"]["providers"]
    assert provider == {"name": "polar", "baseUrl": "http://127.0.0.1:9/s/abc/v1", "apiKey": "sk-session-secret",
                        "models": ["served-model"]}  # fmt: skip
    assert nano.env["NANOCODER_CONFIG_DIR"] == "/polar/home/.config/nanocoder"
    for name in ("grok_cli", "nanocoder"):  # neither reads stdin: a huge instruction is refused, not cut
        with pytest.raises(HarnessError, match="at most"):
            get_harness(name).launch(context(instruction="x" * (ARG_LIMIT + 1)))


def test_new_harnesses_read_their_json_results() -> None:
    openclaw, grok, nano = get_harness("openclaw"), get_harness("grok_cli"), get_harness("nanocoder")
    assert openclaw.check_run(run_result(json.dumps({"ok": True, "status": "ok"}))) is None
    failed = {"ok": False, "status": "error", "error": {"message": "HTTP 400", "kind": "model"}}
    assert "HTTP 400" in (openclaw.check_run(run_result(json.dumps(failed))) or "")
    assert "no JSON" in (openclaw.check_run(run_result("")) or "")
    done = events({"role": "user", "content": "x"}, {"role": "assistant", "content": "Done."})
    assert grok.check_run(run_result(done)) is None
    error = events({"role": "assistant", "content": "Sorry, I encountered an error: Grok API error: 400 nope"})
    assert "400 nope" in (grok.check_run(run_result(error)) or "")
    assert nano.check_run(run_result(json.dumps({"kind": "success", "exitCode": 0}))) is None
    assert "error" in (nano.check_run(run_result(json.dumps({"kind": "error", "error": "bad port"}))) or "")


def test_missing_base_url_family_is_a_clear_error() -> None:
    with pytest.raises(HarnessError, match="no 'google' base URL"):
        get_harness("gemini_cli").launch(context(base_urls={"openai": "http://x/v1"}))


def test_shell_command_forms_and_env() -> None:
    shell = ShellHarness()
    as_string = shell.launch(context(config={"command": 'echo "$POLAR_INSTRUCTION"'}))
    assert as_string.argv == ["bash", "-c", 'echo "$POLAR_INSTRUCTION"']
    assert as_string.env["POLAR_INSTRUCTION"] == NASTY
    assert as_string.env["POLAR_INSTRUCTION_FILE"] == "/polar/home/.polar/instruction.txt"
    assert as_string.files[".polar/instruction.txt"] == NASTY
    assert as_string.env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/s/abc/v1"
    assert as_string.env["ANTHROPIC_API_KEY"] == "sk-session-secret"
    as_argv = shell.launch(context(config={"command": ["python", "agent.py"]}))
    assert as_argv.argv == ["python", "agent.py"]
    huge = shell.launch(context(instruction="y" * (ARG_LIMIT + 1), config={"command": "true"}))
    assert "POLAR_INSTRUCTION" not in huge.env and "POLAR_INSTRUCTION_FILE" in huge.env
    for bad in ({}, {"command": ""}, {"command": [1]}, {"command": "x", "other": 1}, {"command": "x", "files": []}):
        with pytest.raises(ConfigError):
            shell.launch(context(config=bad))


@pytest.mark.parametrize("name", BUILTIN)
def test_doctor_script_calls_the_harness_own_shell_tool(name: str) -> None:
    harness: Harness = get_harness(name)
    first, final = harness.doctor_script("echo hi > f.txt")
    (call,) = first["tool_calls"]
    tool, argument = harness.shell_tool
    assert call["function"]["name"] == tool
    assert json.loads(call["function"]["arguments"])[argument] == "echo hi > f.txt"
    assert final["content"] and not final.get("tool_calls")


def run_result(stdout: str = "", exit_code: int = 0, **fields: Any) -> HarnessRun:
    return HarnessRun(exit_code=exit_code, stdout=stdout, stderr=fields.pop("stderr", ""), **fields)


def events(*items: dict[str, Any]) -> str:
    return "\n".join(json.dumps(item) for item in items) + "\n"


def test_base_check_run() -> None:
    harness = get_harness("shell")
    assert harness.check_run(run_result()) is None
    assert harness.check_run(run_result(exit_code=2)) == "shell exited with status 2"
    assert "timed out" in (harness.check_run(run_result(exit_code=-9, timed_out=True, seconds=5)) or "")


def test_pi_empty_turn_is_a_failure() -> None:
    """The event stream pi printed (--mode json) for a plain-JSON answer to its streamed request: exit 0, empty turn."""
    pi = get_harness("pi")
    user = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    empty = {"role": "assistant", "content": [], "stopReason": "stop"}
    answered = {"role": "assistant", "content": [{"type": "text", "text": "Done."}], "stopReason": "stop"}
    errored = {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "HTTP 500: boom"}
    assert pi.check_run(run_result(events({"type": "agent_end", "messages": [user, answered]}))) is None
    assert "empty assistant turn" in (
        pi.check_run(run_result(events({"type": "agent_end", "messages": [user, empty]}))) or ""
    )
    assert "boom" in (pi.check_run(run_result(events({"type": "agent_end", "messages": [user, errored]}))) or "")
    assert "no agent_end" in (pi.check_run(run_result("")) or "")


def test_opencode_error_event_is_a_failure() -> None:
    opencode = get_harness("opencode")
    ok = events({"type": "step_start"}, {"type": "text"}, {"type": "step_finish"})
    assert opencode.check_run(run_result(ok)) is None
    error = {"type": "error", "error": {"name": "APIError", "data": {"message": "Bad Request: nope"}}}
    assert "Bad Request: nope" in (opencode.check_run(run_result(events(error))) or "")
    assert "no step_finish" in (opencode.check_run(run_result(events({"type": "step_start"}))) or "")


def test_a_cli_needing_a_newer_node_gets_it_installed_beside_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from polar_cli.harnesses.install import MARKER

    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    harness = get_harness("openclaw")
    assert isinstance(harness, NpmHarness)
    assert harness.npm.specs() == ["openclaw@2026.9.6", f"{NODE_PACKAGE}@{harness.node_version}"]
    prefix = harness.npm.prefix
    (prefix / "bin").mkdir(parents=True)
    for name in ("openclaw", "node"):
        (prefix / "bin" / name).write_text("")
    (prefix / MARKER).write_text("{}")
    assert not harness.is_installed()  # the CLI is there, its own Node is not
    node = prefix / "lib" / "node_modules" / NODE_PACKAGE / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("")
    assert harness.is_installed()
