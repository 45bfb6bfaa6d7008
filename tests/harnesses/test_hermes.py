"""Hermes Agent, the built-in PyPI harness: its launch, and the real CLI under ``polar doctor`` and ``polar run``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from polar_cli.errors import ConfigError, HarnessError
from polar_cli.harnesses.testing import check_run, check_streamed, describe, doctor_report, polar_run, require_cli
from polar_cli.interfaces.harness import HarnessContext, HarnessRun
from polar_cli.registry import get_harness

NAME = "hermes"
NASTY = "--help \"double\" 'single' $(touch pwned) `touch pwned2`\nsecond line"


def context(**changes: object) -> HarnessContext:
    base = HarnessContext(
        instruction=NASTY,
        model="served-model",
        api_key="sk-session",
        base_urls={"openai": "http://127.0.0.1:9/s/abc/v1"},
        home="/h/home",
        workdir="/h/session",
        tools=str(get_harness(NAME).tools_dir()),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_launch_is_one_shot_offline_and_the_instruction_is_one_argument() -> None:
    harness = get_harness(NAME)
    launch = harness.launch(context())
    argv = launch.argv
    assert argv[0] == f"{harness.tools_dir()}/bin/hermes"
    assert "--usage-file=/dev/stderr" in argv
    assert argv[-1] == f"--oneshot={NASTY}" and not any(NASTY in arg for arg in argv[:-1])
    assert argv[argv.index("--provider") + 1] == "custom" and argv[argv.index("--model") + 1] == "served-model"
    assert launch.env["HERMES_HOME"] == "/h/home/.hermes" and launch.env["HOME"] == "/h/home"
    assert launch.env["HERMES_DISABLE_LAZY_INSTALLS"] == "1" and "sk-session" not in " ".join(argv)
    assert launch.cwd == "/h/session"
    config = yaml.safe_load(launch.files[".hermes/config.yaml"])
    assert config["model"] == {
        "provider": "custom",
        "default": "served-model",
        "base_url": "http://127.0.0.1:9/s/abc/v1",
        "api_key": "sk-session",
    }
    assert config["model_catalog"] == {"enabled": False} and config["security"]["tirith_enabled"] is False
    assert config["memory"]["memory_enabled"] is False


def test_options_toolsets_and_settings() -> None:
    config = {"toolsets": "terminal,file", "settings": {"agent": {"max_turns": 7}, "lsp": {"enabled": True}}}
    launch = get_harness(NAME).launch(context(config=config))
    argv = launch.argv
    assert argv[argv.index("--toolsets") + 1] == "terminal,file"
    written = yaml.safe_load(launch.files[".hermes/config.yaml"])
    assert written["agent"] == {"max_turns": 7} and written["lsp"] == {"enabled": True}
    assert written["model"]["base_url"] == "http://127.0.0.1:9/s/abc/v1"


def test_settings_may_not_start_an_mcp_server() -> None:
    settings = {"mcp_servers": {"x": {"url": "https://example.com/mcp"}}}
    with pytest.raises(ConfigError, match="config settings may not declare mcp_servers"):
        get_harness(NAME).launch(context(config={"settings": settings}))


# what hermes 0.19.0 prints when its endpoint is gone: exit status 0, the error as the answer, the report failed
FAILED_REPORT = '{\n  "estimated_cost_usd": null,\n  "api_calls": 1,\n  "completed": false,\n  "failed": true\n}'
DONE_REPORT = '{\n  "estimated_cost_usd": null,\n  "api_calls": 2,\n  "completed": true,\n  "failed": false\n}'


def test_a_failed_run_is_told_by_its_usage_report_not_its_exit_status() -> None:
    harness = get_harness(NAME)
    failed = HarnessRun(0, "API call failed after 3 retries: Connection error.\n", FAILED_REPORT)
    assert harness.check_run(failed) == "hermes failed: API call failed after 3 retries: Connection error."
    assert harness.check_run(HarnessRun(0, "ok\n", "")) == "hermes wrote no usage report"
    assert harness.check_run(HarnessRun(0, "Done.\n", "warning: x\n" + DONE_REPORT + "\n")) is None
    assert harness.check_run(HarnessRun(1, "", DONE_REPORT)) == "hermes exited with status 1"


def test_a_container_runtime_is_refused_clearly() -> None:
    with pytest.raises(HarnessError, match="runs only in the local runtime"):
        get_harness(NAME).launch(context(tools="/polar/tools"))


@pytest.mark.harness
def test_doctor_passes_with_the_real_cli() -> None:
    require_cli(NAME)
    report = doctor_report(NAME)
    assert report.ok, describe(report)
    assert len(report.completions) == len([r for r in report.requests if r.kind == "generate"]) == 2


@pytest.mark.harness
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(tmp_path: Path) -> None:
    """`polar run`: scripted backend, prefix_merging, test_on_output; Hermes streams: passed through."""
    require_cli(NAME)
    report = polar_run(NAME, tmp_path)
    check_run(report)
    check_streamed(report)
