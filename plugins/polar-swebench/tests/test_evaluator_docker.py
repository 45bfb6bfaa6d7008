"""``swebench_harness`` against a real Docker Engine: the fixture instance's image, the agent's runtime and a fresh
one, candidate patches made with git (nothing mocked)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult
from polar_cli.interfaces.runtime import RuntimeContext
from polar_cli.models import Trajectory
from polar_cli.models.task import RuntimeSpec
from polar_cli.registry import get_dataset, get_evaluator
from polar_cli.runtimes import start_session
from polar_cli.runtimes.docker import LABEL_SESSION, docker_client

pytestmark = pytest.mark.docker

# what harnesses leave in the repository: never part of the graded patch
DROPPINGS = (
    "mkdir -p .pi/agent calc/__pycache__ && echo '{}' > .pi/agent/settings.json && echo x > calc/__pycache__/c.pyc"
)


async def evaluate_patch(
    image: str, instance: dict[str, Any], patch: str, scratch: Path, **config: Any
) -> tuple[EvaluationResult, str]:
    """Play the agent (apply ``patch`` in its container, leave droppings), then grade in a fresh container."""
    session = f"swe-{secrets.token_hex(3)}"
    spec = RuntimeSpec(backend="docker", image=image, workdir="/testbed")
    agent = await start_session(spec, RuntimeContext(session, scratch_root=scratch))
    try:
        fresh = await start_session(spec, RuntimeContext(session + "-eval", scratch_root=scratch))
        try:
            if patch:
                applied = await agent.exec(["git", "apply", "-"], stdin=patch.encode())
                assert applied.ok, applied.stderr
            assert (await agent.exec(["bash", "-c", DROPPINGS])).ok
            context = EvaluationContext(
                session_id=session,
                status="completed",
                completions=[],
                trajectory=Trajectory(status="completed"),
                config={"instance": instance, **config},
                runtime=agent,
                fresh_runtime=fresh,
            )
            result = await get_evaluator("swebench_harness").evaluate(context)
        finally:
            await fresh.stop()
    finally:
        await agent.stop()
    return result, session


def left_behind(session: str) -> list[str]:
    client = docker_client()
    try:
        found = client.containers.list(all=True, ignore_removed=True)
        return [c.name for c in found if session in c.labels.get(LABEL_SESSION, "")]
    finally:
        client.close()


def grade(swe_image: str, swe_fixture: Any, tmp_path: Path, patch: str, **config: Any) -> dict[str, Any]:
    result, session = asyncio.run(evaluate_patch(swe_image, swe_fixture.instance, patch, tmp_path / "s", **config))
    assert left_behind(session) == []
    assert result.reward == (1.0 if result.details["resolved"] else 0.0)
    return {**result.details, "reward": result.reward}


def test_the_gold_patch_resolves(
    swe_image: str, swe_fixture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_SWEBENCH_LOG_DIR", str(tmp_path / "logs"))  # the operator's log folder
    report = grade(swe_image, swe_fixture, tmp_path, swe_fixture.patches["gold"])
    assert report["reward"] == 1.0, report
    assert (report["patch_applied"], report["apply_method"], report["reason"]) == (True, "git apply", None)
    assert report["patch_dropped"] == [".pi/agent/settings.json", "calc/__pycache__/c.pyc"]
    assert report["tests"] == {
        "FAIL_TO_PASS": {"tests/test_calc.py::test_add": "PASSED"},
        "PASS_TO_PASS": {"tests/test_calc.py::test_sub": "PASSED", "tests/test_calc.py::test_sub_negative": "PASSED"},
    }
    assert report["script_source"] == "instance"
    log = Path(report["log_path"]).read_text()
    assert ">>>>> Start Test Output" in log and "3 passed" in log and "applied patch" in log.lower()


def test_a_wrong_patch_scores_zero(swe_image: str, swe_fixture: Any, tmp_path: Path) -> None:
    report = grade(swe_image, swe_fixture, tmp_path, swe_fixture.patches["wrong"])
    assert report["reward"] == 0.0 and report["patch_applied"] is True
    assert report["tests"]["FAIL_TO_PASS"] == {"tests/test_calc.py::test_add": "FAILED"}
    assert "FAIL_TO_PASS" in report["reason"]


def test_an_empty_patch_scores_zero_with_the_reason(swe_image: str, swe_fixture: Any, tmp_path: Path) -> None:
    report = grade(swe_image, swe_fixture, tmp_path, "")
    assert report["reward"] == 0.0 and report["patch_applied"] is False
    assert report["reason"].startswith("empty patch") and ".pi/agent/settings.json" in report["reason"]


def test_a_patch_that_does_not_apply_scores_zero_with_the_reason(
    swe_image: str, swe_fixture: Any, tmp_path: Path
) -> None:
    # the agent's repository holds the stale change (it was committed there), the fresh checkout does not
    result, _ = asyncio.run(stale_session(swe_image, swe_fixture, tmp_path / "s"))
    report = result.details
    assert result.reward == 0.0 and report["patch_applied"] is False
    assert "does not apply" in report["reason"] and "git apply" in report["reason"] and "patch:" in report["reason"]


async def stale_session(image: str, fixture: Any, scratch: Path) -> tuple[EvaluationResult, str]:
    """A patch that cannot apply to the base commit: the fresh runtime gets it directly as the agent's output."""
    patch = fixture.patches["stale"]
    quoted = patch.replace("'", "'\\''")
    return await evaluate_patch(image, fixture.instance, "", scratch, patch_command=f"printf '%s' '{quoted}'")


def test_a_patch_that_breaks_a_pass_to_pass_test_scores_zero(
    swe_image: str, swe_fixture: Any, tmp_path: Path
) -> None:
    report = grade(swe_image, swe_fixture, tmp_path, swe_fixture.patches["breaks_p2p"])
    assert report["reward"] == 0.0
    assert report["tests"]["FAIL_TO_PASS"] == {"tests/test_calc.py::test_add": "PASSED"}
    assert report["pass_to_pass_failing"] == ["tests/test_calc.py::test_sub", "tests/test_calc.py::test_sub_negative"]
    assert "PASS_TO_PASS" in report["reason"]


def test_an_eval_script_that_times_out_is_not_resolved(
    swe_image: str, swe_fixture: Any, tmp_path: Path
) -> None:
    instance = {**swe_fixture.instance, "eval_script": swe_fixture.instance["eval_script"] + "sleep 60\n"}
    result, session = asyncio.run(evaluate_patch(swe_image, instance, swe_fixture.patches["gold"], tmp_path / "s",
                                                 eval_timeout_seconds=3))  # fmt: skip
    assert left_behind(session) == []
    assert result.reward == 0.0 and result.details["eval_timed_out"] is True
    assert result.details["reason"] == "the eval script timed out"


def test_a_pi_session_run_with_polar_run_is_graded_resolved_in_a_fresh_container(
    swe_image: str, swe_fixture: Any, tmp_path: Path, need_cli: Callable[[str], None],
    resolved_by_polar_run: Callable[[dict[str, Any], Path], Any], pi_edit_script: list[dict[str, Any]],
) -> None:
    """The real pi CLI (scripted backend) edits the repository it starts in (/testbed); `polar run` grades it."""
    need_cli("pi")
    rows = tmp_path / "instances.jsonl"
    rows.write_text(json.dumps(swe_fixture.instance) + "\n")
    options = {"harness": "pi", "model_name": "polar-test", "image_template": swe_image, "timeout_seconds": 300}
    (task,) = get_dataset("swegym").tasks(path=str(rows), eval_timeout_seconds=120, **options)
    data = task.model_dump(mode="json", exclude_none=True)
    data["metadata"]["script"] = pi_edit_script
    result = resolved_by_polar_run(data, tmp_path)
    assert left_behind(result.session_id) == []
