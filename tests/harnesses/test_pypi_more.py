"""gptme and Hermes Agent, the built-in PyPI harnesses: their launch, and the real CLIs under ``polar doctor`` and
``polar run``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from polar_cli.errors import ConfigError, HarnessError
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
from polar_cli.registry import get_harness

NAMES = ["gptme", "hermes"]
NASTY = NASTY_INSTRUCTION


def context(name: str = "gptme", **changes: object) -> HarnessContext:
    return launch_context(name, **changes)


def test_launch_is_headless_offline_and_the_instruction_is_one_argument_after_the_options() -> None:
    harness = get_harness("gptme")
    launch = harness.launch(context())
    argv = launch.argv
    assert argv[0] == f"{harness.tools_dir()}/bin/gptme"
    assert argv[-2:] == ["--", NASTY] and not any(NASTY in arg for arg in argv[:-1])
    assert "--non-interactive" in argv
    assert argv[argv.index("--model") + 1] == "local/served-model"
    assert launch.env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/s/abc/v1"
    assert launch.env["OPENAI_API_KEY"] == "sk-session" and "sk-session" not in " ".join(argv)
    assert launch.env["GPTME_TIKTOKEN_TIMEOUT"] == "0" and launch.env["HOME"] == "/h/home"
    assert launch.cwd == "/h/session"
    # the conversation's config: named (no title call), its workspace the work dir
    chat = '[chat]\nname = "polar"\nworkspace = "/h/session"\n'
    assert launch.files == {".local/share/gptme/logs/polar/config.toml": chat}


def test_options_tool_format_tools_and_settings() -> None:
    config = {"tool_format": "markdown", "tools": "shell,save", "settings": {"prompt": {"files": ["NOTES.md"]}}}
    launch = get_harness("gptme").launch(context(config=config))
    argv = launch.argv
    assert argv[argv.index("--tool-format") + 1] == "markdown"
    assert argv[argv.index("--tools") + 1] == "shell,save"
    assert launch.files[".config/gptme/config.toml"] == '[prompt]\nfiles = ["NOTES.md"]\n'


def test_hermes_launch_is_one_shot_offline_and_the_instruction_is_one_argument() -> None:
    harness = get_harness("hermes")
    launch = harness.launch(context("hermes"))
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


def test_hermes_options_toolsets_and_settings() -> None:
    config = {"toolsets": "terminal,file", "settings": {"agent": {"max_turns": 7}, "lsp": {"enabled": True}}}
    launch = get_harness("hermes").launch(context("hermes", config=config))
    argv = launch.argv
    assert argv[argv.index("--toolsets") + 1] == "terminal,file"
    written = yaml.safe_load(launch.files[".hermes/config.yaml"])
    assert written["agent"] == {"max_turns": 7} and written["lsp"] == {"enabled": True}
    assert written["model"]["base_url"] == "http://127.0.0.1:9/s/abc/v1"


def test_hermes_settings_may_not_start_an_mcp_server() -> None:
    settings = {"mcp_servers": {"x": {"url": "https://example.com/mcp"}}}
    with pytest.raises(ConfigError, match="config settings may not declare mcp_servers"):
        get_harness("hermes").launch(context("hermes", config={"settings": settings}))


# what hermes 0.19.0 prints when its endpoint is gone: exit status 0, the error as the answer, the report failed
FAILED_REPORT = '{\n  "estimated_cost_usd": null,\n  "api_calls": 1,\n  "completed": false,\n  "failed": true\n}'
DONE_REPORT = '{\n  "estimated_cost_usd": null,\n  "api_calls": 2,\n  "completed": true,\n  "failed": false\n}'


def test_a_failed_hermes_run_is_told_by_its_usage_report_not_its_exit_status() -> None:
    harness = get_harness("hermes")
    failed = HarnessRun(0, "API call failed after 3 retries: Connection error.\n", FAILED_REPORT)
    assert harness.check_run(failed) == "hermes failed: API call failed after 3 retries: Connection error."
    assert harness.check_run(HarnessRun(0, "ok\n", "")) == "hermes wrote no usage report"
    assert harness.check_run(HarnessRun(0, "Done.\n", "warning: x\n" + DONE_REPORT + "\n")) is None
    assert harness.check_run(HarnessRun(1, "", DONE_REPORT)) == "hermes exited with status 1"


@pytest.mark.parametrize("name", NAMES)
def test_a_container_runtime_is_refused_clearly(name: str) -> None:
    with pytest.raises(HarnessError, match="runs only in the local runtime"):
        get_harness(name).launch(context(name, tools="/polar/tools"))


@pytest.mark.harness
@pytest.mark.parametrize("name", NAMES)
def test_doctor_passes_with_the_real_cli(name: str) -> None:
    require_cli(name)
    report = doctor_report(name)
    assert report.ok, describe(report)
    assert len(report.completions) == len([r for r in report.requests if r.kind == "generate"]) == 2


@pytest.mark.harness
@pytest.mark.parametrize("name", NAMES)
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(name: str, tmp_path: Path) -> None:
    """`polar run`: scripted backend, prefix_merging, test_on_output; both CLIs stream: passed through."""
    require_cli(name)
    report = polar_run(name, tmp_path)
    check_run(report)
    check_streamed(report)
