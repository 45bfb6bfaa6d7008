"""Where an instance's eval script and log parser come from.

In order: the instance's own ``eval_script`` and ``log_parser`` (``swebench`` 5.x instances, SWE-smith-style
datasets); else the installed ``swebench`` package's per-repo spec tables (4.x: SWE-bench and SWE-bench Verified
repos); else the ``swegym`` package when installed (SWE-Gym's repos; not on PyPI); else a clear error naming what to
install. A parser named by the instance is taken from ``swebench``'s registry when it is installed; without it the
pytest parsers fall back to Polar's own pytest ``-rA``/``-v`` parser.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from polar_cli.api import EvaluationError, parse_pytest_output
from polar_swebench.instance import SweInstance

Parser = Callable[[str], dict[str, str]]
DEFAULT_LOG_PARSER = "parse_log_pytest"
# parsers that read pytest's -rA / -v lines: Polar's own parser reads the same lines when swebench is not installed
PYTEST_PARSERS = frozenset({"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"})
SWEGYM_HINT = "pip install 'swegym @ git+https://github.com/SWE-Gym/SWE-Bench-Package'"
SWEBENCH_HINT = "pip install 'polar-swebench[swebench]'"


@dataclass(frozen=True)
class EvalPlan:
    """The script to run in the eval runtime, the parser for its log, and where both came from."""

    script: str
    parse: Parser
    source: str  # "instance", "swebench" or "swegym"


def _optional(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _test_spec(instance: SweInstance) -> Any:
    """What a ``swebench`` parser is given as its test spec (5.x parsers read a few fields at most)."""
    return SimpleNamespace(**instance.as_row())


def instance_parser(instance: SweInstance) -> Parser:
    name = instance.log_parser or DEFAULT_LOG_PARSER
    parsers = _optional("swebench.harness.log_parsers")
    registry: dict[str, Any] = getattr(parsers, "PARSER_REGISTRY", None) or {}
    if name in registry:
        spec = _test_spec(instance)
        function = registry[name]
        return lambda log: dict(function(log, spec))
    if name in PYTEST_PARSERS:
        return parse_pytest_output
    raise EvaluationError(
        f"instance {instance.instance_id}: log parser {name!r} needs the swebench package ({SWEBENCH_HINT}, "
        "a release with PARSER_REGISTRY)"
    )


def _from_swebench(instance: SweInstance) -> EvalPlan | None:
    """swebench 4.x builds the eval script from its tables for the repos it knows."""
    constants = _optional("swebench.harness.constants")
    specs = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None)
    if not specs or instance.repo not in specs:
        return None
    test_spec = _optional("swebench.harness.test_spec.test_spec")
    parsers = _optional("swebench.harness.log_parsers")
    by_repo = getattr(parsers, "MAP_REPO_TO_PARSER", None)
    if test_spec is None or not by_repo or instance.repo not in by_repo:
        return None
    try:
        spec = test_spec.make_test_spec(instance.as_row())
        script = spec.eval_script
    except Exception as exc:  # the tables lack this version, a field is malformed, ...
        raise EvaluationError(f"instance {instance.instance_id}: swebench cannot build its eval script: {exc}") from exc
    function = by_repo[instance.repo]
    return EvalPlan(script=script, parse=lambda log: dict(function(log, spec)), source="swebench")


def _from_swegym(instance: SweInstance) -> EvalPlan | None:
    """SWE-Gym's fork: only its offline eval-script builder (its full test spec fetches files from GitHub)."""
    constants = _optional("swegym.harness.constants")
    repo = instance.repo.lower()
    specs = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None)
    if not specs or repo not in specs:
        return None
    builder = _optional("swegym.harness.test_spec")
    parsers = _optional("swegym.harness.log_parsers")
    by_repo = getattr(parsers, "MAP_REPO_TO_PARSER", None)
    if builder is None or not by_repo or repo not in by_repo:
        return None
    row = instance.as_row()
    try:
        lines = builder.make_eval_script_list(
            row, specs[repo][instance.version], "testbed", "/testbed", instance.base_commit, instance.test_patch
        )
    except Exception as exc:
        raise EvaluationError(f"instance {instance.instance_id}: swegym cannot build its eval script: {exc}") from exc
    script = "\n".join(["#!/bin/bash", "set -xo pipefail", *lines]) + "\n"
    function = by_repo[repo]
    return EvalPlan(script=script, parse=lambda log: dict(function(log)), source="swegym")


def eval_plan(instance: SweInstance) -> EvalPlan:
    """The eval script and parser for ``instance`` (EvaluationError naming what to install when there is none)."""
    if instance.eval_script:
        return EvalPlan(script=instance.eval_script, parse=instance_parser(instance), source="instance")
    for source in (_from_swebench, _from_swegym):
        plan = source(instance)
        if plan is not None:
            return plan
    raise EvaluationError(
        f"instance {instance.instance_id} ({instance.repo}) carries no eval_script, and no installed package knows "
        f"its repo: install swebench 4.1 for SWE-bench / SWE-bench Verified repos ({SWEBENCH_HINT} 'swebench==4.1.0') "
        f"or SWE-Gym's package for SWE-Gym repos ({SWEGYM_HINT})"
    )
