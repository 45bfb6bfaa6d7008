"""gptme, the built-in PyPI harness: its launch, and the real CLI under ``polar doctor`` and ``polar run``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from polar_cli.errors import HarnessError
from polar_cli.harnesses.testing import check_run, check_streamed, describe, doctor_report, polar_run, require_cli
from polar_cli.interfaces.harness import HarnessContext
from polar_cli.registry import get_harness

NAME = "gptme"
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


def test_launch_is_headless_offline_and_the_instruction_is_one_argument_after_the_options() -> None:
    harness = get_harness(NAME)
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
    launch = get_harness(NAME).launch(context(config=config))
    argv = launch.argv
    assert argv[argv.index("--tool-format") + 1] == "markdown"
    assert argv[argv.index("--tools") + 1] == "shell,save"
    assert launch.files[".config/gptme/config.toml"] == '[prompt]\nfiles = ["NOTES.md"]\n'


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
    """`polar run`: scripted backend, prefix_merging, test_on_output; gptme streams: passed through."""
    require_cli(NAME)
    report = polar_run(NAME, tmp_path)
    check_run(report)
    check_streamed(report)
