"""Where an instance's eval script and log parser come from.

In order: the instance's own ``eval_script`` and ``log_parser`` (``swebench`` 5.x instances, SWE-smith-style
datasets); else the installed ``swebench`` package's per-repo spec tables (4.1: SWE-bench, SWE-bench Verified,
Multimodal and Multilingual repos), its own ``make_test_spec`` and log parser; else, for SWE-Gym's 11 repos, the
script SWE-Gym's harness writes, from the facts :mod:`polar_swebench.swegym` carries; else a clear error naming what
to install. A parser named by the instance is the installed ``swebench``'s function of that name (5.x: its
``PARSER_REGISTRY``; 4.1: the ``parse_log_*`` functions of its ``log_parsers`` modules); without ``swebench`` the
pytest parsers fall back to Polar's own pytest ``-rA``/``-v`` parser.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import ModuleType, SimpleNamespace
from typing import Any

from polar_cli.api import EvaluationError, parse_pytest_output
from polar_swebench import swegym
from polar_swebench.instance import SweInstance

Parser = Callable[[str], dict[str, str]]
DEFAULT_LOG_PARSER = "parse_log_pytest"
# parsers that read pytest's -rA / -v lines: Polar's own parser reads the same lines when swebench is not installed
PYTEST_PARSERS = frozenset({"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"})
SWEBENCH_HINT = "pip install 'polar-swebench[swebench]', i.e. 'swebench>=4.1,<5'"


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


@cache
def swebench_parsers() -> dict[str, Any]:
    """The installed ``swebench``'s log parsers by name (empty without it)."""
    package = _optional("swebench.harness.log_parsers")
    if package is None:
        return {}
    registry = getattr(package, "PARSER_REGISTRY", None)  # 5.x
    if registry:
        return dict(registry)
    found: dict[str, Any] = {}
    for module in pkgutil.iter_modules(getattr(package, "__path__", [])):  # 4.1: one module per language
        loaded = _optional(f"{package.__name__}.{module.name}")
        found.update({k: v for k, v in vars(loaded).items() if k.startswith("parse_log_") and callable(v)})
    return found


def named_parser(name: str, instance: SweInstance) -> Parser:
    """The parser called ``name``: the installed ``swebench``'s, else Polar's pytest parser for the pytest ones."""
    function = swebench_parsers().get(name)
    if function is not None:
        spec = _test_spec(instance)
        return lambda log: dict(function(log, spec))
    if name in PYTEST_PARSERS:
        return parse_pytest_output
    raise EvaluationError(
        f"instance {instance.instance_id}: log parser {name!r} needs the swebench package ({SWEBENCH_HINT})"
    )


def instance_parser(instance: SweInstance) -> Parser:
    return named_parser(instance.log_parser or DEFAULT_LOG_PARSER, instance)


def _from_swebench(instance: SweInstance) -> EvalPlan | None:
    """swebench 4.1's eval script and parser for the repos its tables know.

    Its own ``make_eval_script_list`` and ``TestSpec.eval_script`` write the script, exactly as its ``make_test_spec``
    does; ``make_test_spec`` itself is not called because it also builds the environment script, which fetches
    requirements files from GitHub for some repos (django, matplotlib, flask, xarray, pylint, ...).
    """
    constants = _optional("swebench.harness.constants")
    specs = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None)
    if constants is None or not specs or instance.repo not in specs:
        return None
    scripts = _optional("swebench.harness.test_spec.create_scripts")
    test_spec = _optional("swebench.harness.test_spec.test_spec")
    by_repo = getattr(_optional("swebench.harness.log_parsers"), "MAP_REPO_TO_PARSER", None)
    if scripts is None or test_spec is None or not by_repo or instance.repo not in by_repo:
        return None
    row = instance.as_row()
    try:
        repo_specs = specs[instance.repo][instance.version]
        lines = scripts.make_eval_script_list(row, repo_specs, "testbed", "/testbed", instance.base_commit,
                                              instance.test_patch)  # fmt: skip
        spec = test_spec.TestSpec(
            instance_id=instance.instance_id, repo=instance.repo, version=instance.version, repo_script_list=[],
            eval_script_list=lines, env_script_list=[], arch="x86_64", FAIL_TO_PASS=instance.fail_to_pass,
            PASS_TO_PASS=instance.pass_to_pass, language=constants.MAP_REPO_TO_EXT[instance.repo],
            docker_specs=repo_specs.get("docker_specs", {}), namespace=None,
        )  # fmt: skip
        script = spec.eval_script
    except Exception as exc:  # the tables lack this version, a field is malformed, ...
        raise EvaluationError(
            f"instance {instance.instance_id}: swebench cannot build its eval script: {exc!r}"
        ) from exc
    function = by_repo[instance.repo]
    return EvalPlan(script=script, parse=lambda log: dict(function(log, spec)), source="swebench")


def _from_swegym_facts(instance: SweInstance) -> EvalPlan | None:
    """SWE-Gym's repos: the script SWE-Gym's harness writes, from the facts Polar carries."""
    if not swegym.knows(instance.repo):
        return None
    parse = named_parser(swegym.parser_name(instance.repo), instance)
    return EvalPlan(script=swegym.eval_script(instance), parse=parse, source="swegym")


def eval_plan(instance: SweInstance) -> EvalPlan:
    """The eval script and parser for ``instance`` (EvaluationError naming what to install when there is none)."""
    if instance.eval_script:
        return EvalPlan(script=instance.eval_script, parse=instance_parser(instance), source="instance")
    for source in (_from_swebench, _from_swegym_facts):
        plan = source(instance)
        if plan is not None:
            return plan
    raise EvaluationError(
        f"instance {instance.instance_id} ({instance.repo}) carries no eval_script, its repo is none of SWE-Gym's, "
        f"and no installed swebench knows it: install swebench 4.1 for SWE-bench / SWE-bench Verified repos "
        f"({SWEBENCH_HINT}; 5.x no longer builds eval scripts)"
    )
