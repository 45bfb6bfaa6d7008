"""Polar's grading rule on real pytest ``-rA`` output (pytest runs on a tiny project here; nothing hand-written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from polar_swebench import scripts
from polar_swebench.grading import END_MARKER, START_MARKER, grade, output_section
from polar_swebench.instance import SweInstance
from polar_swebench.scripts import eval_plan, instance_parser

from polar_cli.errors import EvaluationError

T = "test_sample.py::"


@pytest.fixture(scope="module")
def pytest_log(tmp_path_factory: pytest.TempPathFactory, sample_tests: str) -> str:
    """What ``pytest -rA`` printed for the sample tests, wrapped in the harness's start/end markers."""
    project = tmp_path_factory.mktemp("sample")
    (project / "test_sample.py").write_text(sample_tests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "test_sample.py"],
                          cwd=project, capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # one test fails, one errors
    return f"+ git apply -v -\nApplied patch.\n+ : '{START_MARKER}'\n{done.stdout}+ : '{END_MARKER}'\n"


def statuses(log: str) -> dict[str, str]:
    instance = SweInstance(instance_id="x__y-1", repo="x/y", log_parser="parse_log_pytest")
    return instance_parser(instance)(output_section(log))


def test_real_pytest_output_is_parsed(pytest_log: str) -> None:
    seen = statuses(pytest_log)
    assert seen[T + "test_passes"] == "PASSED"
    assert seen[T + "test_fails"] == "FAILED"
    assert seen[T + "test_xfails"] == "XFAIL"
    assert seen[T + "test_errors"] == "ERROR"
    assert seen[T + "test_param[1]"] == seen[T + "test_param[2]"] == "PASSED"
    assert seen.get(T + "test_skipped", "MISSING") in ("SKIPPED", "MISSING")


def test_resolved_when_every_fail_to_pass_and_pass_to_pass_test_passes(pytest_log: str) -> None:
    report = grade(statuses(pytest_log), [T + "test_passes", T + "test_xfails"], [T + "test_param[1]"], log=pytest_log)
    assert report.resolved and report.reason is None
    assert report.fail_to_pass == {T + "test_passes": "PASSED", T + "test_xfails": "XFAIL"}
    empty = grade(statuses(pytest_log), [T + "test_passes"], [], log=pytest_log)
    assert empty.resolved  # an empty PASS_TO_PASS list passes


@pytest.mark.parametrize("test", ["test_fails", "test_errors", "test_skipped", "test_not_in_the_log"])
def test_a_fail_to_pass_test_that_does_not_pass_fails(pytest_log: str, test: str) -> None:
    """Skipped and missing FAIL_TO_PASS tests fail too (SWE-Gym's fork calls an all-skipped instance resolved)."""
    report = grade(statuses(pytest_log), [T + "test_passes", T + test], [T + "test_param[2]"], log=pytest_log)
    assert not report.resolved
    assert report.reason is not None and "FAIL_TO_PASS" in report.reason and test in report.reason
    assert report.as_details()["fail_to_pass_failing"] == [T + test]


def test_a_broken_pass_to_pass_test_fails(pytest_log: str) -> None:
    report = grade(statuses(pytest_log), [T + "test_passes"], [T + "test_param[1]", T + "test_fails"], log=pytest_log)
    assert not report.resolved and "PASS_TO_PASS" in (report.reason or "")
    assert report.pass_to_pass == {T + "test_param[1]": "PASSED", T + "test_fails": "FAILED"}


def test_a_run_that_errored_or_timed_out_is_not_resolved(pytest_log: str) -> None:
    seen, f2p = statuses(pytest_log), [T + "test_passes"]
    assert grade(seen, f2p, [], log=pytest_log).resolved
    timed_out = grade(seen, f2p, [], log=pytest_log, run_error="the eval script timed out")
    assert not timed_out.resolved and timed_out.reason == "the eval script timed out"
    errored = grade(seen, f2p, [], log=pytest_log + ">>>>> Tests Errored\n")
    assert not errored.resolved and errored.reason == "the test run errored"
    forged = grade({T + "test_passes": "PASSED"}, f2p, [], log="PASSED x\n>>>>> Test Exit Code: 2\n")
    assert not forged.resolved and "exited with 2" in (forged.reason or "")
    assert grade({}, [], [], log="").reason == "no test results found in the eval log"


def test_only_the_marked_section_is_parsed(pytest_log: str) -> None:
    before = "PASSED test_sample.py::test_fails\n"  # e.g. printed by an install step before the markers
    assert statuses(before + pytest_log)[T + "test_fails"] == "FAILED"
    assert output_section("no markers here") == "no markers here"


def test_a_script_comes_from_the_instance() -> None:
    plan = eval_plan(SweInstance(instance_id="a__b-1", repo="a/b", eval_script="echo hi\n"))
    assert (plan.source, plan.script) == ("instance", "echo hi\n")


def test_without_swebench_a_non_pytest_parser_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scripts, "swebench_parsers", lambda: {})  # as where swebench is not installed
    with pytest.raises(EvaluationError, match=r"parser 'parse_log_cargo' needs the swebench package"):
        eval_plan(SweInstance(instance_id="a__b-1", repo="a/b", eval_script="x", log_parser="parse_log_cargo"))
    plan = eval_plan(SweInstance(instance_id="a__b-1", repo="a/b", eval_script="x", log_parser="parse_log_pytest"))
    assert plan.parse("PASSED t.py::test_a\n") == {"t.py::test_a": "PASSED"}  # Polar's own pytest parser


def test_an_instance_without_a_script_names_what_to_install() -> None:
    with pytest.raises(EvaluationError, match=r"no eval_script, its repo is none of SWE-Gym's.*swebench>=4.1,<5"):
        eval_plan(SweInstance(instance_id="someone__unknown-1", repo="someone/unknown", version="1.0"))


def test_evaluator_config_errors_name_the_field(tmp_path: Path) -> None:
    from polar_cli.errors import ConfigError
    from polar_cli.registry import get_evaluator

    evaluator = get_evaluator("swebench_harness")
    with pytest.raises(ConfigError, match=r"unknown field 'eval_timeout'"):
        evaluator.check_config({"instance": {"instance_id": "a", "repo": "b", "eval_script": "x"}, "eval_timeout": 3})
    with pytest.raises(ConfigError, match=r"instance\.repo"):
        evaluator.check_config({"instance": {"instance_id": "a", "base_commit": "c0ffee"}})  # a row, lacking repo
    with pytest.raises(ConfigError, match=r"no eval_script"):
        evaluator.check_config({"instance": {"instance_id": "getmoto__moto-1", "repo": "someone/unknown"}})
    evaluator.check_config({"instance": {"instance_id": "a", "repo": "b", "eval_script": "x"}})
