from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_cli.errors import HarnessError
from polar_cli.harnesses.testing import (
    NASTY_INSTRUCTION,
    check_run,
    check_streamed,
    describe,
    doctor_report,
    launch_context,
    polar_run,
    require_cli,
)
from polar_cli.interfaces.harness import HarnessContext, HarnessRun
from polar_cli.registry import LOAD_ENV, get_harness, reset_registry

NAME = "aider"
NASTY = NASTY_INSTRUCTION


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(LOAD_ENV, "aider")
    reset_registry()
    yield
    reset_registry()


def context(**changes: object) -> HarnessContext:
    return launch_context(NAME, **changes)


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "aider"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    row = next(row for row in json.loads(out.stdout) if row["name"] == NAME)
    assert {"kind": "harness", "package": "polar-aider"}.items() <= row.items()


def test_launch_is_headless_offline_and_reads_the_instruction_from_a_file() -> None:
    harness = get_harness(NAME)
    launch = harness.launch(context())
    argv = launch.argv
    assert argv[0] == f"{harness.tools_dir()}/bin/aider"
    assert option(argv, "--model") == "openai/served-model"
    assert option(argv, "--openai-api-base") == "http://127.0.0.1:9/s/abc/v1"
    assert option(argv, "--message-file") == "/h/home/.polar/instruction.txt"
    assert launch.files[".polar/instruction.txt"] == NASTY and not any(NASTY in arg for arg in argv)
    for flag in ("--yes-always", "--no-check-update", "--no-analytics", "--no-detect-urls", "--no-git"):
        assert flag in argv
    metadata = json.loads(launch.files[".aider/model.metadata.json"])
    assert metadata["openai/served-model"]["litellm_provider"] == "openai"
    assert option(argv, "--model-metadata-file") == "/h/home/.aider/model.metadata.json"
    assert launch.env["OPENAI_API_KEY"] == "sk-session" and "sk-session" not in " ".join(argv)
    assert launch.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert "--test-cmd" not in argv


def test_options_test_cmd_git_and_edit_format() -> None:
    ctx = context(config={"test_cmd": "pytest -x", "git": True, "edit_format": "diff", "context_window": 4096})
    launch = get_harness(NAME).launch(ctx)
    assert option(launch.argv, "--test-cmd") == "pytest -x" and "--auto-test" in launch.argv
    assert "--no-git" not in launch.argv and "--no-auto-commits" in launch.argv
    assert option(launch.argv, "--edit-format") == "diff"
    assert json.loads(launch.files[".aider/model.metadata.json"])["openai/served-model"]["max_input_tokens"] == 4096


@pytest.mark.parametrize("instruction", ["/run touch pwned", "!touch pwned"])
def test_an_instruction_is_never_one_of_aiders_commands(instruction: str) -> None:
    launch = get_harness(NAME).launch(context(instruction=instruction))
    assert launch.files[".polar/instruction.txt"] == "\n" + instruction


def test_a_container_runtime_is_refused_clearly() -> None:
    with pytest.raises(HarnessError, match="runs only in the local runtime"):
        get_harness(NAME).launch(context(tools="/polar/tools"))


def test_a_failed_model_call_fails_the_run_though_aider_exits_0() -> None:
    run = HarnessRun(exit_code=0, stdout="litellm.APIConnectionError: OpenAIException - Connection error.", stderr="")
    assert "litellm.APIConnectionError" in (get_harness(NAME).check_run(run) or "")
    assert get_harness(NAME).check_run(HarnessRun(exit_code=0, stdout="Applied edit to x.py", stderr="")) is None


@pytest.mark.harness
def test_doctor_passes_with_the_real_cli() -> None:
    require_cli(NAME)
    report = doctor_report(NAME)
    assert report.ok, describe(report)
    assert len(report.completions) == len([r for r in report.requests if r.kind == "generate"]) == 2


@pytest.mark.harness
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(tmp_path: Path) -> None:
    """`polar run`: scripted backend, prefix_merging, test_on_output; aider streams: passed through."""
    require_cli(NAME)
    report = polar_run(NAME, tmp_path)
    check_run(report)
    check_streamed(report)
