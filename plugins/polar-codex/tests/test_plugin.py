from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_cli.harnesses.testing import (
    check_run,
    check_streamed,
    describe,
    doctor_report,
    in_ci,
    missing_cli_reason,
    polar_run,
)
from polar_cli.interfaces.harness import HarnessContext
from polar_cli.registry import LOAD_ENV, get_harness, reset_registry

NASTY = "--help \"double\" 'single' $(touch pwned) `touch pwned2`\nsecond line"


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(LOAD_ENV, "codex")
    reset_registry()
    yield
    reset_registry()


def context() -> HarnessContext:
    return HarnessContext(
        instruction=NASTY,
        model="served-model",
        api_key="sk-session",
        base_urls={"openai": "http://127.0.0.1:9/s/abc/v1"},
        home="/polar/home",
        workdir="/polar/session",
        tools="/polar/tools",
    )


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "codex"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    rows = json.loads(out.stdout)
    assert {"kind": "harness", "name": "codex", "package": "polar-codex"}.items() <= next(
        row for row in rows if row["name"] == "codex"
    ).items()


def test_launch_writes_config_toml_in_the_session_home_and_reads_the_instruction_from_stdin() -> None:
    launch = get_harness("codex").launch(context())
    assert launch.argv[0] == "/polar/tools/bin/codex"
    assert launch.argv[1:3] == ["exec", "--skip-git-repo-check"] and launch.argv[-1] == "-"
    assert not any(NASTY in arg for arg in launch.argv)
    assert launch.stdin == NASTY.encode()
    assert launch.env["CODEX_HOME"] == "/polar/home/.codex"
    config = tomllib.loads(launch.files[".codex/config.toml"])
    assert config["model"] == config["review_model"] == "served-model"
    assert config["approval_policy"] == "never" and config["sandbox_mode"] == "danger-full-access"
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:9/s/abc/v1" and provider["wire_api"] == "responses"
    assert launch.env[provider["env_key"]] == "sk-session"
    assert config["features"]["plugins"] is False and config["analytics"]["enabled"] is False


def test_settings_merge_into_config_toml() -> None:
    ctx = context()
    ctx = HarnessContext(**{**ctx.__dict__, "config": {"settings": {"model_context_window": 32768}}})
    config = tomllib.loads(get_harness("codex").launch(ctx).files[".codex/config.toml"])
    assert config["model_context_window"] == 32768


def test_doctor_script_uses_exec_command() -> None:
    first, _ = get_harness("codex").doctor_script("ls")
    assert first["tool_calls"][0]["function"]["name"] == "exec_command"
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"cmd": "ls"}


@pytest.mark.harness
def test_doctor_passes_with_the_real_cli() -> None:
    reason = missing_cli_reason(get_harness("codex"))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    report = doctor_report("codex")
    assert report.ok, describe(report)
    assert len(report.completions) == len([r for r in report.requests if r.kind == "generate"]) == 2


@pytest.mark.harness
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(tmp_path: Path) -> None:
    """`polar run`: scripted backend, prefix_merging, test_on_output (the file the CLI was asked to write)."""
    reason = missing_cli_reason(get_harness("codex"))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    report = polar_run("codex", tmp_path)
    check_run(report)
    check_streamed(report)  # the scripted backend streams: pass-through, as with vLLM
