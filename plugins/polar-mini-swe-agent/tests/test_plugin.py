from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from polar_cli.errors import HarnessError
from polar_cli.harnesses.testing import (
    NASTY_INSTRUCTION,
    check_run,
    describe,
    doctor_report,
    launch_context,
    polar_run,
    require_cli,
)
from polar_cli.interfaces.harness import HarnessContext
from polar_cli.registry import LOAD_ENV, get_harness, reset_registry

NAME = "mini_swe_agent"
NASTY = NASTY_INSTRUCTION


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(LOAD_ENV, "mini-swe-agent")
    reset_registry()
    yield
    reset_registry()


def context(**changes: object) -> HarnessContext:
    return launch_context(NAME, **changes)


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "mini-swe-agent"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    row = next(row for row in json.loads(out.stdout) if row["name"] == NAME)
    assert {"kind": "harness", "package": "polar-mini-swe-agent"}.items() <= row.items()


def test_the_task_and_the_gateway_go_into_a_config_file_not_argv() -> None:
    harness = get_harness(NAME)
    launch = harness.launch(context())
    assert launch.argv == [f"{harness.tools_dir()}/bin/mini", "-c", "mini.yaml", "-c", "/h/home/.polar/mini.yaml"]
    assert launch.stdin is None and launch.cwd == "/h/session"
    config = yaml.safe_load(launch.files[".polar/mini.yaml"])
    assert config["run"]["task"] == NASTY
    assert config["agent"]["mode"] == "yolo" and config["agent"]["confirm_exit"] is False
    model = config["model"]
    assert model["model_name"] == "openai/served-model"
    assert model["model_kwargs"] == {"api_base": "http://127.0.0.1:9/s/abc/v1", "api_key": "sk-session"}
    assert config["environment"]["cwd"] == "/h/session"
    assert launch.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and launch.env["MSWEA_CONFIGURED"] == "true"
    assert launch.env["HOME"] == "/h/home" and "sk-session" not in " ".join(launch.argv)


def test_settings_merge_into_the_config_file() -> None:
    ctx = context(config={"settings": {"agent": {"step_limit": 7}, "model": {"model_kwargs": {"temperature": 0}}}})
    config = yaml.safe_load(get_harness(NAME).launch(ctx).files[".polar/mini.yaml"])
    assert config["agent"]["step_limit"] == 7 and config["agent"]["mode"] == "yolo"
    assert config["model"]["model_kwargs"]["temperature"] == 0 and config["model"]["model_kwargs"]["api_key"]


def test_a_container_runtime_is_refused_clearly() -> None:
    with pytest.raises(HarnessError, match="runs only in the local runtime"):
        get_harness(NAME).launch(context(tools="/polar/tools"))


def test_doctor_script_ends_with_minis_submit_command() -> None:
    first, last = get_harness(NAME).doctor_script("ls")
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    assert json.loads(last["tool_calls"][0]["function"]["arguments"]) == {
        "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    }


@pytest.mark.harness
def test_doctor_passes_with_the_real_cli() -> None:
    require_cli(NAME)
    report = doctor_report(NAME)
    assert report.ok, describe(report)
    assert len(report.completions) == len([r for r in report.requests if r.kind == "generate"]) == 2


@pytest.mark.harness
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(tmp_path: Path) -> None:
    """`polar run`: scripted backend, prefix_merging, test_on_output. litellm calls without streaming, so there is
    no stream to pass through (every call is recorded as a plain completion)."""
    require_cli(NAME)
    report = polar_run(NAME, tmp_path)
    check_run(report)
    assert not any(c.metadata.get("stream") for c in report.completions)
