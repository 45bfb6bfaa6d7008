"""``polar run`` end to end with each built-in harness's real CLI: the scripted backend plays the model, the harness
writes a file through its own shell tool, ``test_on_output`` checks it, and the trajectory passes ``verify``.

codex and claude_code have the same test in their plugin packages (plugins/polar-*/tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_cli.harnesses.testing import (
    check_run,
    check_side_chain,
    check_streamed,
    in_ci,
    missing_cli_reason,
    polar_run,
    polar_run_file,
    side_call_run,
)
from polar_cli.registry import get_harness

pytestmark = pytest.mark.harness


def need_cli(name: str) -> None:
    reason = missing_cli_reason(get_harness(name))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.mark.parametrize("name", ["shell", "pi", "qwen_code", "gemini_cli", "opencode"])
def test_polar_run_completes_with_reward_one_and_a_verified_trajectory(tmp_path: Path, name: str) -> None:
    """The harnesses that stream (all but shell) get pass-through streams: the scripted backend streams token ids."""
    need_cli(name)
    report = polar_run(name, tmp_path)
    check_run(report)
    if name != "shell":
        check_streamed(report)


@pytest.mark.docker
@pytest.mark.parametrize("name", ["shell", "pi"])
def test_polar_run_in_docker_scores_in_a_fresh_container(tmp_path: Path, docker_image: str, name: str) -> None:
    """refresh_runtime: the check runs in a second container, prewarmed during RUNNING, after the agent's patch."""
    need_cli(name)
    report = polar_run(name, tmp_path, "docker", refresh_runtime=True, image=docker_image)
    check_run(report)
    assert report.result is not None and report.result.metadata["evaluation"]["refreshed"] is True
    from polar_cli.runtimes.docker import LABEL_SESSION, docker_client

    client = docker_client()
    try:  # both containers (the agent's, and the fresh one labelled <session>-eval) are gone
        left = [c.name for c in client.containers.list(all=True, ignore_removed=True)
                if report.result.session_id in c.labels.get(LABEL_SESSION, "")]  # fmt: skip
        assert left == []
    finally:
        client.close()


def test_qwen_codes_memory_agent_is_a_side_chain_without_the_reward(tmp_path: Path) -> None:
    """After a turn that needed no tool, Qwen Code runs its background memory extraction agent (its own system
    prompt, a new chain): ``side``, no reward, not trainable under the default ``reward_to``; the answer gets it."""
    need_cli("qwen_code")
    report = side_call_run("qwen_code", tmp_path, "Nothing durable to remember.")
    check_side_chain(report, "qwen_code: the background memory extraction agent (its system prompt)")


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("task", "script", "harness"),
    [("pi-hello.yaml", "pi-hello.yaml", "pi"), ("shell-agent.yaml", "two-turns.yaml", "shell")],
)
def test_the_readme_examples_run_as_documented(tmp_path: Path, task: str, script: str, harness: str) -> None:
    """The README's quickstart commands, verbatim but for where results go."""
    need_cli(harness)
    reports = polar_run_file(Path("examples", task), tmp_path, "--script", f"examples/scripts/{script}", cwd=ROOT)
    for report in reports:
        check_run(report)
        assert len(report.completions) == 2
