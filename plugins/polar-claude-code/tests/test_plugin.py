from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_cli.harnesses.testing import (
    check_run,
    check_side_chain,
    check_streamed,
    describe,
    doctor_report,
    in_ci,
    missing_cli_reason,
    polar_run,
    side_call_run,
)
from polar_cli.interfaces.harness import HarnessContext, HarnessRun
from polar_cli.registry import LOAD_ENV, get_harness, reset_registry

NASTY = "--help \"double\" 'single' $(touch pwned) `touch pwned2`\nsecond line"


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(LOAD_ENV, "claude-code")
    reset_registry()
    yield
    reset_registry()


def context(**config: object) -> HarnessContext:
    return HarnessContext(
        instruction=NASTY,
        model="served-model",
        api_key="sk-session",
        base_urls={"anthropic": "http://127.0.0.1:9/s/abc"},
        home="/polar/home",
        workdir="/polar/session",
        tools="/polar/tools",
        config=config,
    )


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "claude-code"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    rows = json.loads(out.stdout)
    assert {"kind": "harness", "name": "claude_code", "package": "polar-claude-code"}.items() <= next(
        row for row in rows if row["name"] == "claude_code"
    ).items()


def test_launch_pins_model_gateway_and_home() -> None:
    launch = get_harness("claude_code").launch(context())
    assert launch.argv[0] == "/polar/tools/bin/claude"
    assert "-p" in launch.argv and "--dangerously-skip-permissions" in launch.argv
    assert not any(NASTY in arg for arg in launch.argv)
    assert launch.stdin == NASTY.encode()
    env = launch.env
    assert env["CLAUDE_CONFIG_DIR"] == "/polar/home/.claude" and env["HOME"] == "/polar/home"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/s/abc" and env["ANTHROPIC_API_KEY"] == "sk-session"
    for variable in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"):
        assert env[variable] == "served-model"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["IS_SANDBOX"] == "1"
    assert launch.files == {}
    with_settings = get_harness("claude_code").launch(context(settings={"env": {"X": "1"}}))
    assert json.loads(with_settings.files[".claude/settings.json"]) == {"env": {"X": "1"}}


def test_result_object_with_is_error_is_a_failure_even_on_exit_0() -> None:
    claude = get_harness("claude_code")
    ok = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "Done."})
    bad = json.dumps({"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 400 nope"})
    assert claude.check_run(HarnessRun(0, ok, "")) is None
    assert "API Error: 400 nope" in (claude.check_run(HarnessRun(0, bad, "")) or "")
    assert "no result object" in (claude.check_run(HarnessRun(0, "", "")) or "")


@pytest.mark.harness
def test_doctor_passes_with_the_real_cli() -> None:
    reason = missing_cli_reason(get_harness("claude_code"))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    report = doctor_report("claude_code")
    assert report.ok, describe(report)
    generations = [r for r in report.requests if r.kind == "generate"]
    assert len(report.completions) == len(generations) == 2
    # its side requests (HEAD /, count_tokens) are answered but never recorded as generations
    assert all(r.status == 200 for r in report.requests)


@pytest.mark.harness
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(tmp_path: Path) -> None:
    """`polar run`: scripted backend, prefix_merging, test_on_output (the file the CLI was asked to write)."""
    reason = missing_cli_reason(get_harness("claude_code"))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    report = polar_run("claude_code", tmp_path)
    check_run(report)
    check_streamed(report)  # the scripted backend streams: pass-through, as with vLLM


STOP_HOOK = {"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": "Did the assistant greet the user?"}]}]}}


@pytest.mark.harness
def test_a_prompt_hooks_evaluator_call_is_a_side_chain_without_the_reward(tmp_path: Path) -> None:
    """A prompt-type Stop hook (set up through the task's agent config) makes Claude Code ask the model itself, with
    its own system prompt: that chain is ``side``, no reward, not trainable under the default ``reward_to``."""
    reason = missing_cli_reason(get_harness("claude_code"))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    verdict = '{"ok": true, "reason": "it said Hello."}'
    report = side_call_run("claude_code", tmp_path, verdict, config={"settings": STOP_HOOK})
    check_side_chain(report, "claude_code: a prompt hook's evaluator call (its system prompt)")
