"""SWE-Gym's eval scripts from the facts Polar carries, checked against what SWE-Gym's own harness writes.

``fixtures/swegym_scripts.json`` holds, for each row of ``fixtures/swegym_rows.jsonl`` (one row per SWE-Gym repo and
per distinct install/test spec of it: 20 rows, all 11 repos), the script SWE-Gym's ``make_eval_script_list``
wrote (``fixtures/make_swegym_scripts.py``, run against SWE-Gym/SWE-Bench-Package 16dd480). Polar's script is that
script plus SWE-bench's two start/end marker lines around the test command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from polar_swebench import swegym
from polar_swebench.grading import END_MARKER, START_MARKER
from polar_swebench.instance import SweInstance
from polar_swebench.scripts import eval_plan

from polar_cli.errors import ConfigError
from polar_cli.registry import get_dataset, get_evaluator

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = [json.loads(line) for line in (FIXTURES / "swegym_rows.jsonl").read_text().splitlines()]
SCRIPTS: dict[str, str] = json.loads((FIXTURES / "swegym_scripts.json").read_text())
SWEGYM_REPOS = {"getmoto/moto", "python/mypy", "pandas-dev/pandas", "dask/dask", "project-monai/monai",
                "iterative/dvc", "conan-io/conan", "pydantic/pydantic", "facebookresearch/hydra", "bokeh/bokeh",
                "modin-project/modin"}  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[row["instance_id"] for row in ROWS])
def test_the_script_is_swegym_s_own_with_the_markers(row: dict[str, Any]) -> None:
    plan = eval_plan(SweInstance.model_validate(row))
    assert plan.source == "swegym"
    marker_lines = [f": '{START_MARKER}'\n", f": '{END_MARKER}'\n"]
    assert all(line in plan.script for line in marker_lines)
    without = plan.script
    for line in marker_lines:
        without = without.replace(line, "")
    assert without == SCRIPTS[row["instance_id"]]


def test_the_rows_cover_every_repo_and_spec_polar_carries() -> None:
    assert set(swegym.repos()) == SWEGYM_REPOS
    covered = {(row["repo"].lower(), json.dumps(swegym.spec(row["repo"], row["version"]))) for row in ROWS}
    table = {(repo, json.dumps(spec)) for repo in swegym.repos()
             for spec in swegym._table()[repo]["specs"]}  # fmt: skip
    assert covered == table


def test_the_test_command_is_swegym_s() -> None:
    by_id = {row["instance_id"]: SweInstance.model_validate(row) for row in ROWS}
    mypy = next(i for i in by_id.values() if i.repo == "python/mypy" and i.version == "1.0")
    assert swegym.test_command(mypy, "pytest -n0 -rA -k") == (
        'pytest -n0 -rA -k "testWalrusInComprehension or testWalrusNested"'
    )
    dask = next(i for i in by_id.values() if i.repo == "dask/dask")  # its test patch also touches a .json file
    assert swegym.test_command(dask, "pytest") == "pytest dask/array/tests/test_array_core.py"
    assert "export PYTHONPATH=${PYTHONPATH:-}:$(pwd)" in eval_plan(next(
        i for i in by_id.values() if i.repo == "conan-io/conan")).script  # fmt: skip


def test_moto_7365_matches_an_independent_copy_of_swegym_s_scripts() -> None:
    """NVIDIA-NeMo/Gym's resources_servers/swerl_gen/README.md carries SWE-Gym's setup and test scripts of
    getmoto__moto-7365 (the setup: conda, ``make init``, the test-file reset, the test patch; the test: the command)."""
    (row,) = [row for row in ROWS if row["instance_id"] == "getmoto__moto-7365"]
    script = eval_plan(SweInstance.model_validate(row)).script
    base = "7f6c9cb1deafb280fe7fcc7551c38e397f11a706"
    test_file = "tests/test_dynamodb/test_dynamodb_update_expressions.py"
    setup_tail = f"conda activate testbed\nmake init\ngit checkout {base} {test_file}\n"
    setup_tail += "git apply -v - <<'EOF_114329324912'\n"
    assert setup_tail + row["test_patch"] + "\nEOF_114329324912\n" in script
    assert f"\npytest -n0 -rA {test_file}\n" in script


def test_log_parsers_are_swegym_s_choice() -> None:
    assert swegym.parser_name("pydantic/pydantic") == "parse_log_pytest_v2"
    assert {swegym.parser_name(repo) for repo in SWEGYM_REPOS - {"pydantic/pydantic"}} == {"parse_log_pytest"}


def test_an_unknown_version_is_refused_naming_it(tmp_path: Path) -> None:
    row = {**ROWS[0], "version": "99.9"}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (task,) = get_dataset("swegym").tasks(path=str(path))
    with pytest.raises(ConfigError, match=r"SWE-Gym has no install and test commands for .* version '99.9'"):
        get_evaluator("swebench_harness").check_config(task.evaluator.config)


def test_swegym_rows_need_no_package(tmp_path: Path) -> None:
    """Every fixture row becomes a task whose evaluator config checks, with no swegym package anywhere."""
    with pytest.raises(ImportError):
        __import__("swegym")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    tasks = list(get_dataset("swegym").tasks(path=str(path)))
    assert len(tasks) == len(ROWS)
    for task in tasks:
        get_evaluator("swebench_harness").check_config(task.evaluator.config)
