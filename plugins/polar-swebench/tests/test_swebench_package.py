"""Polar against the installed ``swebench`` package (the ``[swebench]`` extra, 4.1; ``.ci/run`` installs it).

1. The eval script Polar runs for an instance without its own is the one ``swebench``'s ``make_test_spec`` writes,
   for the SWE-bench Verified rows in ``fixtures/swebench_rows.jsonl`` and one row of every other repo family the
   package knows (Multimodal JS, Multilingual Go/Java/Rust/C/PHP/Ruby); the rows go the way Polar's own do (dataset
   -> task -> evaluator config). ``make_test_spec`` also writes the environment script, which fetches requirements
   files from GitHub for some repos: that fetch, which cannot run here, is the one thing replaced (by an empty file);
   the eval script does not depend on it.
2. Polar's grade of real test logs (pytest run for real by a SWE-bench-style eval script, stdout and stderr in one
   log as Polar's evaluator takes it) against the package's own ``get_logs_eval`` / ``get_eval_report``, test by
   test, including the cases where Polar is stricter on purpose (STRICTER below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from polar_swebench.datasets import SwebenchVerifiedDataset
from polar_swebench.grading import END_MARKER, START_MARKER, grade, output_section
from polar_swebench.instance import SweInstance
from polar_swebench.scripts import eval_plan, named_parser, swebench_parsers

from polar_cli.harnesses.testing import in_ci

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = [json.loads(line) for line in (FIXTURES / "swebench_rows.jsonl").read_text().splitlines()]


def swebench_or_fail() -> ModuleType:
    """The installed swebench 4.1 test-spec module; missing it fails under CI (``.ci/run`` installs it)."""
    try:
        import swebench.harness.test_spec.test_spec as test_spec  # type: ignore[import-not-found]
    except ImportError as exc:
        reason = f"swebench 4.1 is not installed ({exc}): pip install 'polar-swebench[swebench]'"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return test_spec


@pytest.fixture(scope="module")
def make_test_spec() -> Iterator[Any]:
    test_spec = swebench_or_fail()
    import swebench.harness.test_spec.python as python_specs  # type: ignore[import-not-found]

    with pytest.MonkeyPatch.context() as patch:  # GitHub cannot be reached: the environment script gets no files
        patch.setattr(python_specs, "get_requirements_by_commit", lambda repo, commit: "")
        patch.setattr(python_specs, "get_environment_yml_by_commit", lambda repo, commit, env_name: "")
        yield test_spec.make_test_spec


@pytest.fixture(scope="module")
def polar_instances(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweInstance]:
    """The fixture rows as Polar's evaluator receives them: through the swebench_verified dataset's tasks."""
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    tasks = SwebenchVerifiedDataset().tasks(path=str(path))
    return {task.task_id: SweInstance.model_validate(task.evaluator.config["instance"]) for task in tasks}


@pytest.mark.parametrize("row", ROWS, ids=[row["instance_id"] for row in ROWS])
def test_polar_runs_the_eval_script_swebench_writes(
    row: dict[str, Any], make_test_spec: Any, polar_instances: dict[str, SweInstance]
) -> None:
    plan = eval_plan(polar_instances[row["instance_id"]])
    assert plan.source == "swebench"
    assert plan.script == make_test_spec(row).eval_script


def test_the_rows_cover_every_repo_family_the_package_knows(make_test_spec: Any) -> None:
    import swebench.harness.constants as constants  # type: ignore[import-not-found]

    families = _families(constants)
    covered = {family for family, repos in families.items() if any(row["repo"] in repos for row in ROWS)}
    assert covered == set(families) and len(families) == 8, families.keys()
    verified = {row["repo"] for row in ROWS if row.get("difficulty")}
    assert len(verified) == 12  # every SWE-bench Verified repo


def _families(constants: ModuleType) -> dict[str, set[str]]:
    import importlib
    import pkgutil

    found = {}
    for module in pkgutil.iter_modules(constants.__path__):
        loaded = importlib.import_module(f"{constants.__name__}.{module.name}")
        for name, table in vars(loaded).items():
            if name.startswith("MAP_REPO_VERSION_TO_SPECS_"):
                found[name.rsplit("_", 1)[1]] = set(table)
    return found


# --- grading real logs -------------------------------------------------------------------------------------------

UNITTEST_TESTS = """
import unittest


class Sample(unittest.TestCase):
    def test_fixed(self):
        self.assertTrue(True)

    def test_still_passes(self):
        self.assertTrue(True)

    def test_broken(self):
        self.assertEqual(1, 2)

    @unittest.skip("skipped by the patch")
    def test_skipped(self):
        pass
"""
# the shape of swebench 4.1's eval scripts: set -x traces the no-op marker lines (on stderr) around the test command
EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
cd "$1"
: '{start}'
{command}
: '{end}'
"""


@dataclass(frozen=True)
class Runner:
    """A real test run, graded as an instance of ``repo`` (whose swebench parser reads this runner's output)."""

    repo: str
    version: str
    parser: str
    source: str | None  # None: conftest's pytest sample
    command: str
    test: str  # a test's name in the log, from its function name
    names: dict[str, str]  # the cases' names of tests -> function names

    def name(self, test: str) -> str:
        return self.test.format(self.names.get(test, test))


RUNNERS = {
    "pytest": Runner("pytest-dev/pytest", "7.2", "parse_log_pytest", None,
                     f"{sys.executable} -m pytest -rA -p no:cacheprovider tests/test_sample.py",
                     "tests/test_sample.py::{}", {"test_fixed": "test_passes", "test_still_passes": "test_param[1]",
                                                  "test_broken": "test_fails"}),
    # Django's runner prints unittest's verbose lines; swebench reads them with parse_log_django
    "unittest": Runner("django/django", "3.0", "parse_log_django", UNITTEST_TESTS,
                       f"{sys.executable} -m unittest -v tests.test_sample", "{0} (tests.test_sample.Sample.{0})", {}),
}  # fmt: skip


@pytest.fixture(scope="module")
def real_logs(tmp_path_factory: pytest.TempPathFactory, sample_tests: str) -> dict[str, str]:
    """The logs of real runs: each eval script run by bash on a sample project, stderr merged into stdout."""
    logs = {}
    for name, runner in RUNNERS.items():
        root = tmp_path_factory.mktemp(name)
        (root / "tests").mkdir()
        (root / "tests" / "__init__.py").write_text("")
        (root / "tests" / "test_sample.py").write_text(runner.source or sample_tests)
        script = root / "eval.sh"
        script.write_text(EVAL_SCRIPT.format(start=START_MARKER, end=END_MARKER, command=runner.command))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        done = subprocess.run(["bash", "-c", 'exec bash "$1" "$2" 2>&1', "eval", str(script), str(root)],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert f"+ : '{START_MARKER}'" in done.stdout and runner.name("test_broken") in done.stdout, done.stdout
        logs[name] = done.stdout
    return logs


@dataclass(frozen=True)
class Case:
    name: str
    runner: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    polar: bool = False  # resolved by Polar's rule
    swebench: bool = False  # resolved by swebench 4.1's
    log_suffix: str = ""
    fail_only: bool = False  # graded with 4.1's fail-only rule (its Multimodal JS repos)


CASES = [
    Case("resolved", "pytest", ("test_fixed",), ("test_still_passes",), polar=True, swebench=True),
    Case("xfail counts as passing", "pytest", ("test_xfails",), ("test_still_passes",), polar=True, swebench=True),
    Case("empty PASS_TO_PASS", "pytest", ("test_fixed",), (), polar=True, swebench=True),
    Case("FAIL_TO_PASS fails", "pytest", ("test_fixed", "test_broken"), ("test_still_passes",)),
    Case("FAIL_TO_PASS errors", "pytest", ("test_errors",), ()),
    Case("FAIL_TO_PASS missing", "pytest", ("test_fixed", "test_not_in_the_log"), ()),
    # pytest -rA names no skipped test (its summary says 'SKIPPED [1] file:line'): missing for both
    Case("FAIL_TO_PASS skipped, unnamed in pytest -rA", "pytest", ("test_fixed", "test_skipped"), ()),
    Case("PASS_TO_PASS fails", "pytest", ("test_fixed",), ("test_broken",)),
    Case("PASS_TO_PASS missing", "pytest", ("test_fixed",), ("test_not_in_the_log",)),
    Case("the run timed out", "pytest", ("test_fixed",), (), log_suffix=">>>>> Tests Timed Out\n"),
    Case("the test patch did not apply", "pytest", ("test_fixed",), (), log_suffix=">>>>> Patch Apply Failed\n"),
    Case("resolved, unittest runner", "unittest", ("test_fixed",), ("test_still_passes",), polar=True, swebench=True),
    Case("FAIL_TO_PASS fails, unittest runner", "unittest", ("test_broken",), ("test_still_passes",)),
    Case("PASS_TO_PASS skipped is no regression", "unittest", ("test_fixed",), ("test_skipped",),
         polar=True, swebench=True),
    # STRICTER on purpose: a skipped FAIL_TO_PASS test is not a fix (4.1 counts it as neither passing nor failing, so
    # an instance whose other FAIL_TO_PASS tests pass, or whose every one is skipped, is resolved there; 5.x agrees
    # with Polar)
    Case("STRICTER: a FAIL_TO_PASS test skipped", "unittest", ("test_fixed", "test_skipped"), (), swebench=True),
    Case("STRICTER: every FAIL_TO_PASS test skipped", "unittest", ("test_skipped",), ("test_still_passes",),
         swebench=True),
    # STRICTER on purpose: a FAIL_TO_PASS test missing from the log is not a fix (4.1's fail-only rule, for its
    # Multimodal JS repos, counts only a FAILED test as failing)
    Case("STRICTER: a FAIL_TO_PASS test missing, fail-only rule", "pytest", ("test_fixed", "test_not_in_the_log"),
         (), swebench=True, fail_only=True),
]  # fmt: skip


def _swebench_grade(log: Path, runner: Runner, f2p: list[str], p2p: list[str], fail_only: bool) -> tuple[bool, Any]:
    """swebench 4.1's own grading of ``log`` as an instance of ``runner.repo``."""
    from swebench.harness.constants import EvalType, ResolvedStatus  # type: ignore[import-not-found]
    from swebench.harness.grading import (  # type: ignore[import-not-found]
        get_eval_report,
        get_eval_tests_report,
        get_logs_eval,
        get_resolution_status,
    )

    spec = swebench_or_fail().TestSpec(
        instance_id="x__x-0", repo=runner.repo, version=runner.version, repo_script_list=[], eval_script_list=[],
        env_script_list=[], arch="x86_64", FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, language="py", docker_specs={},
        namespace=None,
    )  # fmt: skip
    statuses, found = get_logs_eval(spec, str(log))
    if fail_only:
        gold = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
        report = get_eval_tests_report(statuses, gold, eval_type=EvalType.FAIL_ONLY)
        return found and get_resolution_status(report) == ResolvedStatus.FULL.value, statuses
    prediction = {"instance_id": spec.instance_id, "model_name_or_path": "polar", "model_patch": "diff"}
    report_map = get_eval_report(spec, prediction, str(log), include_tests_status=False)
    return report_map[spec.instance_id]["resolved"], statuses


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_polar_grades_real_logs_like_swebench_except_where_stricter(
    case: Case, real_logs: dict[str, str], tmp_path: Path
) -> None:
    swebench_or_fail()
    runner = RUNNERS[case.runner]
    f2p = [runner.name(t) for t in case.fail_to_pass]
    p2p = [runner.name(t) for t in case.pass_to_pass]
    text = real_logs[case.runner] + case.log_suffix
    log = tmp_path / "test_output.txt"
    log.write_text(text)
    instance = SweInstance(instance_id="x__x-0", repo=runner.repo, version=runner.version, eval_script="(above)",
                           log_parser=runner.parser, FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p)  # fmt: skip
    statuses = eval_plan(instance).parse(output_section(text))
    ours = grade(statuses, f2p, p2p, log=text)
    theirs, their_statuses = _swebench_grade(log, runner, f2p, p2p, case.fail_only)
    assert (ours.resolved, theirs) == (case.polar, case.swebench), ours.reason
    if their_statuses:  # swebench reads no statuses from a log with an error marker
        assert statuses == their_statuses
    assert case.name.startswith("STRICTER") == (case.polar != case.swebench)


def test_parsers_named_by_instances_are_the_package_s_own(real_logs: dict[str, str]) -> None:
    swebench_or_fail()
    from swebench.harness.log_parsers.python import (  # type: ignore[import-not-found]
        parse_log_pytest,
        parse_log_pytest_v2,
    )

    parsers = swebench_parsers()
    assert parsers["parse_log_pytest"] is parse_log_pytest and parsers["parse_log_pytest_v2"] is parse_log_pytest_v2
    assert {"parse_log_cargo", "parse_log_gotest", "parse_log_jest", "parse_log_maven"} <= set(parsers)
    instance = SweInstance(instance_id="a__b-1", repo="a/b", eval_script="x", log_parser="parse_log_pytest")
    section = output_section(real_logs["pytest"])
    assert named_parser("parse_log_pytest", instance)(section) == parse_log_pytest(section, None)
    assert named_parser("parse_log_pytest_v2", instance)(section) == parse_log_pytest_v2(section, None)
