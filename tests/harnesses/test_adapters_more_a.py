"""What the cline, kilocode and continue_cli adapters ask for (no CLI needed)."""

from __future__ import annotations

import json

from polar_cli.harnesses.npm import ARG_LIMIT
from polar_cli.registry import get_harness
from tests.harnesses.test_adapters import NASTY, context, events, run_result


def test_cline_pins_provider_and_model_in_providers_json_only() -> None:
    launch = get_harness("cline").launch(context(config={"settings": {"compactionStrategy": "basic"}}))
    providers = json.loads(launch.files[".cline/data/settings/providers.json"])
    assert providers["lastUsedProvider"] == "openai-compatible"
    assert providers["providers"]["openai-compatible"]["settings"] == {
        "provider": "openai-compatible",
        "apiKey": "sk-session-secret",
        "model": "served-model",
        "baseUrl": "http://127.0.0.1:9/s/abc/v1",
    }
    settings = json.loads(launch.files[".cline/data/settings/global-settings.json"])
    assert settings == {"telemetryOptOut": True, "autoUpdateEnabled": False, "compactionStrategy": "basic"}
    assert launch.env["CLINE_DIR"] == "/polar/home/.cline"
    assert launch.env["CLINE_SESSION_BACKEND_MODE"] == "local"  # no background hub daemon
    assert "-P" not in launch.argv and "-m" not in launch.argv  # they would rewrite providers.json without baseUrl
    assert launch.argv[1] == "--json" and launch.argv[-2:] == ["--", NASTY] and launch.stdin is None


def test_cline_takes_one_word_and_huge_instructions_on_stdin() -> None:
    for instruction in ("hello", "x" * (ARG_LIMIT + 1)):
        launch = get_harness("cline").launch(context(instruction=instruction))
        assert launch.stdin == instruction.encode()
        assert "--json" not in launch.argv and not any(instruction in a for a in launch.argv)


def test_kilocode_is_opencode_with_its_own_paths_and_switches() -> None:
    launch = get_harness("kilocode").launch(context(config={"model_limits": {"context": 8192}}))
    config = json.loads(launch.files[".config/kilo/kilo.json"])
    assert config["$schema"] == "https://app.kilo.ai/config.json"
    assert config["model"] == config["small_model"] == "polar/served-model"
    assert config["provider"]["polar"]["models"]["served-model"]["limit"] == {"context": 8192}
    assert launch.env["KILO_DISABLE_AUTOUPDATE"] == launch.env["KILO_DISABLE_SESSION_INGEST"] == "1"
    assert launch.env["KILO_TELEMETRY_LEVEL"] == "off"
    assert not any(key.startswith("OPENCODE_") for key in launch.env)
    opencode = get_harness("opencode").launch(context())
    assert ".config/opencode/opencode.json" in opencode.files and opencode.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"


def test_continue_cli_config_and_stdin() -> None:
    launch = get_harness("continue_cli").launch(context())
    config = json.loads(launch.files[".continue/polar.yaml"])  # JSON is YAML
    (model,) = config["models"]
    assert model["provider"] == "openai" and model["model"] == "served-model"
    assert model["apiBase"] == "http://127.0.0.1:9/s/abc/v1" and model["apiKey"] == "sk-session-secret"
    assert launch.argv[1:] == ["-p", "--auto", "--format=json", "--config", "/polar/home/.continue/polar.yaml"]
    assert launch.stdin == NASTY.encode()
    assert launch.env["CONTINUE_CLI_ENABLE_TELEMETRY"] == launch.env["CONTINUE_METRICS_ENABLED"] == "0"


def test_cline_and_continue_cli_failures_that_exit_zero() -> None:
    cline = get_harness("cline")
    assert cline.check_run(run_result(events({"type": "run_result", "finishReason": "completed"}))) is None
    failed = events({"type": "run_result", "finishReason": "error"})
    assert "ended with error" in (cline.check_run(run_result(failed)) or "")
    cn = get_harness("continue_cli")
    assert cn.check_run(run_result(events({"response": "ok", "status": "success"}))) is None
    assert "status error" in (cn.check_run(run_result(events({"response": "no", "status": "error"}))) or "")
    assert "no JSON answer" in (cn.check_run(run_result("plain text\n")) or "")
