"""SWE-Gym's eval scripts without SWE-Gym's unpublished package.

The facts are SWE-Gym's own: ``swegym_specs.json`` holds, for SWE-Gym's 11 repos, each version's ``install``,
``test_cmd`` and ``eval_commands`` as SWE-Gym's harness has them (github.com/SWE-Gym/SWE-Bench-Package at 16dd480,
MIT, ``swegym/harness/constants.py`` ``MAP_REPO_VERSION_TO_SPECS``; extracted by running that module, the versions
sharing one spec grouped). The script is the one its ``make_eval_script_list`` writes: activate conda env
``testbed``, ``cd /testbed``, the version's install step, reset the test files to the base commit, apply the test
patch, run the test command on the files the test patch touches (mypy selects its ``[case ...]`` names with ``-k``),
reset the test files. Polar adds SWE-bench's ``: '>>>>> Start Test Output'`` / ``End`` no-op lines around the test
command, so that only the test run's output is parsed (SWE-Gym parses the whole log).

Log parsers: SWE-Gym parses every repo's log with its pytest ``-rA`` parser except pydantic's (``-vv`` lines, the
status last), which is ``swebench``'s ``parse_log_pytest_v2`` (SWE-Gym's copy also drops a ``[..]`` after FAILED,
which the ``console_output_style=classic`` output it runs never prints).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.resources import files
from typing import Any

from polar_cli.api import EvaluationError
from polar_swebench.grading import END_MARKER, START_MARKER
from polar_swebench.instance import SweInstance

ENV_NAME = "testbed"
REPO_DIR = "/testbed"
HEREDOC = "EOF_114329324912"
# SWE-Gym's NON_TEST_EXTS ("csv" without its dot, as SWE-Gym has it)
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
PARSERS = {"pydantic/pydantic": "parse_log_pytest_v2"}
DEFAULT_PARSER = "parse_log_pytest"


@cache
def _table() -> dict[str, Any]:
    text = files("polar_swebench").joinpath("swegym_specs.json").read_text(encoding="utf-8")
    return {repo: facts for repo, facts in json.loads(text).items() if not repo.startswith("_")}


def repos() -> list[str]:
    """SWE-Gym's repos (lower-cased, as SWE-Gym keys them)."""
    return sorted(_table())


def knows(repo: str) -> bool:
    return repo.lower() in _table()


def spec(repo: str, version: str | None) -> dict[str, Any]:
    """The install / test_cmd / eval_commands of ``repo`` at ``version`` (EvaluationError naming both when unknown)."""
    facts = _table()[repo.lower()]
    index = facts["versions"].get(version or "")
    if index is None:
        raise EvaluationError(
            f"SWE-Gym has no install and test commands for {repo} version {version!r} "
            f"(known: {', '.join(facts['versions'])})"
        )
    return dict(facts["specs"][index])


def test_command(instance: SweInstance, test_cmd: str) -> str:
    """SWE-Gym's ``make_test_command``: the test files of the test patch, or mypy's ``-k`` case names."""
    test_patch = instance.test_patch or ""
    if instance.repo == "python/mypy":
        cases = re.findall(r"\[case ([^\]]+)\]", test_patch)
        return f'{test_cmd} "{" or ".join(cases)}"'
    directives = re.findall(r"diff --git a/.* b/(.*)", test_patch)
    directives = [d for d in directives if not any(d.endswith(ext) for ext in NON_TEST_EXTS)]
    return " ".join([test_cmd, *directives])


def eval_script(instance: SweInstance) -> str:
    """SWE-Gym's eval script for ``instance``, with SWE-bench's start/end markers around the test command."""
    facts = spec(instance.repo, instance.version)
    base = instance.base_commit or ""
    test_patch = instance.test_patch or ""
    test_files = re.findall(r"--- a/(.*)", test_patch)
    reset_tests = f"git checkout {base} {' '.join(test_files)}"
    lines = ["source /opt/miniconda3/bin/activate", f"conda activate {ENV_NAME}", f"cd {REPO_DIR}"]
    lines += facts.get("eval_commands", [])
    lines += [
        f"git config --global --add safe.directory {REPO_DIR}",
        f"cd {REPO_DIR}",
        "git status",
        "git show",
        f"git diff {base}",
        "source /opt/miniconda3/bin/activate",
        f"conda activate {ENV_NAME}",
    ]
    if facts.get("install"):
        lines.append(facts["install"])
    lines += [
        reset_tests,
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}",
        f": '{START_MARKER}'",
        test_command(instance, facts["test_cmd"]),
        f": '{END_MARKER}'",
        reset_tests,
    ]
    return "\n".join(["#!/bin/bash", "set -xo pipefail", *lines]) + "\n"


def parser_name(repo: str) -> str:
    return PARSERS.get(repo.lower(), DEFAULT_PARSER)
