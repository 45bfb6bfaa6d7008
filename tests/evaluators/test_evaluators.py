"""The built-in evaluators, run against the real ``local`` runtime (real processes, real git, real pytest)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import ConfigError, EvaluationError
from polar_cli.evaluators.outcomes import parse_junit_xml, parse_pytest_output
from polar_cli.interfaces.evaluator import EvaluationContext, EvaluationResult
from polar_cli.interfaces.runtime import RuntimeContext, RuntimeHandle
from polar_cli.models import PrepareAction, RuntimeSpec, Trace, Trajectory
from polar_cli.registry import get_evaluator
from polar_cli.runtimes import start_session

# Identical author/committer identity and dates: two runtimes prepared alike get the same commit (as two clones of
# one repository at one commit would).
GIT_ENV = {
    "GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@example.invalid", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "polar", "GIT_COMMITTER_EMAIL": "polar@example.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}  # fmt: skip
REPO_PREPARE = "mkdir repo && cd repo && git init -q -b main && printf 'one\\n' >a.txt && git add . && git commit -qm b"
PYTEST = f"{sys.executable} -m pytest -p no:cacheprovider"
TESTS = """
import pytest
def test_ok(): pass
def test_bad(): assert False
@pytest.mark.parametrize("x", ["a b"])
def test_param(x): pass
"""


def trajectory(n: int = 2) -> Trajectory:
    return Trajectory(status="completed", traces=[Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1])] * n)


def context(status: str = "completed", **kwargs: Any) -> EvaluationContext:
    return EvaluationContext(
        session_id="s", status=status, completions=[], trajectory=kwargs.pop("trajectory", trajectory()), **kwargs
    )  # type: ignore[arg-type]


async def start(tmp_path: Path, name: str, prepare: list[str] = ()) -> RuntimeHandle:  # type: ignore[assignment]
    spec = RuntimeSpec(env=GIT_ENV, prepare=[PrepareAction(command=c) for c in prepare])
    return await start_session(spec, RuntimeContext(name, scratch_root=tmp_path / "scratch"))


async def evaluate(config: dict[str, Any], **kwargs: Any) -> EvaluationResult:
    return await get_evaluator("test_on_output").evaluate(context(config=config, **kwargs))


# ---- parsing ------------------------------------------------------------------------------------------------------


def test_pytest_lines_summary_and_verbose_forms() -> None:
    text = "\n".join(
        [
            "tests/x.py::test_a PASSED                                  [ 33%]",
            "\x1b[32mtests/x.py::test_b FAILED\x1b[0m                   [ 66%]",
            "tests/x.py::test_c[a b] PASSED                             [100%]",
            "=========================== short test summary info ===",
            "PASSED tests/x.py::test_a",
            "FAILED tests/x.py::test_b - AssertionError: assert False",
            "ERROR tests/y.py::test_d - fixture 'db' not found",
            "XFAIL tests/y.py::test_e - reason",
            "SKIPPED [1] tests/y.py:3: no network",
            "some other line PASSED",
        ]
    )
    assert parse_pytest_output(text) == {
        "tests/x.py::test_a": "PASSED",
        "tests/x.py::test_b": "FAILED",
        "tests/x.py::test_c[a b]": "PASSED",
        "tests/y.py::test_d": "ERROR",
        "tests/y.py::test_e": "XFAIL",
    }


def test_junit_report() -> None:
    xml = b"""<?xml version="1.0"?><testsuites><testsuite name="pytest">
      <testcase classname="tests.test_x" name="test_ok"/>
      <testcase classname="tests.test_x" name="test_bad"><failure message="x"/></testcase>
      <testcase classname="tests.test_x" name="test_err"><error message="x"/></testcase>
      <testcase name="bare"><skipped/></testcase>
    </testsuite></testsuites>"""
    assert parse_junit_xml(xml) == {
        "tests.test_x::test_ok": "PASSED",
        "tests.test_x::test_bad": "FAILED",
        "tests.test_x::test_err": "ERROR",
        "bare": "SKIPPED",
    }
    with pytest.raises(EvaluationError, match="not valid XML"):
        parse_junit_xml(b"<testsuite>")


# ---- session_completion -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "reward"), [("completed", 1.0), ("timeout", 0.0), ("error", 0.0)])
def test_session_completion(status: str, reward: float) -> None:
    result = asyncio.run(get_evaluator("session_completion").evaluate(context(status)))
    assert result.reward == reward and result.per_trace_rewards is None
    scored = result.apply(trajectory(3))
    assert scored.reward == reward and [t.reward for t in scored.traces] == [reward] * 3  # broadcast to every trace


def test_per_trace_rewards_and_their_length_check() -> None:
    result = EvaluationResult(reward=1.0, per_trace_rewards=[0.5, 1.0])
    assert [t.reward for t in result.apply(trajectory(2)).traces] == [0.5, 1.0]
    with pytest.raises(EvaluationError, match="2 per-trace rewards for 3 traces"):
        result.apply(trajectory(3))
    with pytest.raises(EvaluationError, match="finite"):
        EvaluationResult(reward=float("nan"))


# ---- test_on_output in a real runtime ---------------------------------------------------------------------------


def test_exit_code_scoring_with_a_string_and_an_argv_command(tmp_path: Path) -> None:
    async def body() -> None:
        handle = await start(tmp_path, "exit", ["echo hi > done.txt"])
        try:
            ok = await evaluate({"command": "test -f done.txt && grep -q hi done.txt"}, runtime=handle)
            assert ok.reward == 1.0 and ok.details["exit_code"] == 0 and not ok.details["refreshed"]
            missing = await evaluate({"command": ["test", "-f", "nothing.txt"]}, runtime=handle)
            assert missing.reward == 0.0 and missing.details["exit_code"] == 1
            custom = await evaluate({"command": "exit 3", "pass_exit_codes": [3]}, runtime=handle)
            assert custom.reward == 1.0
            env = await evaluate({"command": 'test "$FLAVOR" = tart', "env": {"FLAVOR": "tart"}}, runtime=handle)
            assert env.reward == 1.0
        finally:
            await handle.stop()

    asyncio.run(body())


def test_a_command_out_of_time_scores_zero(tmp_path: Path) -> None:
    async def body() -> None:
        handle = await start(tmp_path, "slow")
        try:
            result = await evaluate({"command": "sleep 30", "timeout_seconds": 0.5}, runtime=handle)
            assert result.reward == 0.0 and result.details["timed_out"] is True
        finally:
            await handle.stop()

    asyncio.run(body())


def test_expected_tests_from_pytest_output_all_or_fraction_and_from_junit(tmp_path: Path) -> None:
    async def body() -> None:
        handle = await start(tmp_path, "pytest")
        try:
            await handle.write_file("test_x.py", TESTS)
            command = f"{PYTEST} -rA -q test_x.py"
            good = ["test_x.py::test_ok", "test_x.py::test_param[a b]"]
            all_good = await evaluate({"command": command, "expected_pass": good}, runtime=handle)
            assert all_good.reward == 1.0 and all_good.details["exit_code"] == 1  # another test failed: ignored
            assert all_good.details["tests_seen"] == 3
            mixed = [*good, "test_x.py::test_bad", "test_x.py::test_gone"]
            strict = await evaluate({"command": command, "expected_pass": mixed}, runtime=handle)
            assert strict.reward == 0.0
            assert strict.details["not_passed"] == {"test_x.py::test_bad": "FAILED", "test_x.py::test_gone": "MISSING"}
            fraction = {"command": command, "expected_pass": mixed, "scoring": "fraction"}
            assert (await evaluate(fraction, runtime=handle)).reward == 0.5
            junit = {
                "command": f"{PYTEST} -q test_x.py --junitxml=report.xml",
                "results_file": "report.xml",
                "expected_pass": ["test_x::test_ok", "test_x::test_bad"],
                "scoring": "fraction",
            }
            assert (await evaluate(junit, runtime=handle)).reward == 0.5
        finally:
            await handle.stop()

    asyncio.run(body())


def test_refresh_runtime_applies_the_agents_patch_in_the_fresh_runtime(tmp_path: Path) -> None:
    async def body() -> None:
        agent = await start(tmp_path, "agent", [REPO_PREPARE])
        fresh = await start(tmp_path, "fresh", [REPO_PREPARE])
        try:
            # the agent commits one change, leaves another uncommitted and adds an untracked file
            work = "cd repo && printf 'two\\n' >> a.txt && git commit -qam agent && printf 'three\\n' >> a.txt"
            assert (await agent.exec(["bash", "-c", work + " && printf 'new\\n' > b.txt"])).ok
            config = {"command": "test \"$(cat a.txt)\" = \"$(printf 'one\\ntwo\\nthree')\" && test -f b.txt",
                      "cwd": "repo"}  # fmt: skip
            result = await evaluate(config, runtime=agent, fresh_runtime=fresh)
            assert result.reward == 1.0, result.details
            assert result.details["refreshed"] is True
            # the tests ran in the fresh runtime: it now has the agent's changes on top of its own base commit
            assert (await fresh.exec(["git", "log", "--format=%s"], cwd="repo")).stdout.split() == ["b"]
            assert (await fresh.exec(["cat", "b.txt"], cwd="repo")).stdout == "new\n"
        finally:
            await agent.stop()
            await fresh.stop()

    asyncio.run(body())


def test_a_patch_that_does_not_apply_scores_zero(tmp_path: Path) -> None:
    async def body() -> None:
        agent = await start(tmp_path, "agent", [REPO_PREPARE])
        other = REPO_PREPARE.replace("one", "different")
        fresh = await start(tmp_path, "fresh", [other, "cd repo && printf 'x\\n' > a.txt && git commit -qam drift"])
        try:
            assert (await agent.exec(["bash", "-c", "cd repo && printf 'two\\n' >> a.txt"])).ok
            result = await evaluate({"command": "true", "cwd": "repo"}, runtime=agent, fresh_runtime=fresh)
            assert result.reward == 0.0 and "git apply failed" in result.details["patch_error"]
        finally:
            await agent.stop()
            await fresh.stop()

    asyncio.run(body())


def test_config_errors_name_the_field_and_a_missing_runtime_is_an_evaluation_error(tmp_path: Path) -> None:
    evaluator = get_evaluator("test_on_output")
    with pytest.raises(ConfigError, match="unknown field 'expect_pass' \\(did you mean 'expected_pass'\\?\\)"):
        evaluator.check_config({"command": "true", "expect_pass": []})
    with pytest.raises(ConfigError, match="command: Field required"):
        evaluator.check_config({})
    with pytest.raises(ConfigError, match="scoring"):
        asyncio.run(evaluate({"command": "true", "expected_pass": ["t"], "scoring": "some"}))
    with pytest.raises(EvaluationError, match="no runtime"):
        asyncio.run(evaluate({"command": "true"}))
    assert not (tmp_path / "scratch").exists() or list((tmp_path / "scratch").iterdir()) == []
