"""The SWE instance columns of the ``messages`` config (the fields the paper released) and the session's grade.

Every task gets these columns (one schema per config, whatever the tasks); they are null where a task has no such
field, as a non-SWE task has none. A task's instance fields come from its ``metadata``, else from its evaluator
config's ``instance`` mapping (where polar-swebench's datasets attach the whole SWE-bench row: ``problem_statement``,
``FAIL_TO_PASS``, ...), else, per session, from the evaluator's report (``metadata.evaluation``: ``swebench_harness``
reports ``instance_id``, ``repo``, ``base_commit``, ``version`` and each graded test, also for a task that named its
instance by id only; its ``problem_statement`` is then null). The grade is that report's
(``resolved``, ``patch_applied``, ``reason``, each FAIL_TO_PASS / PASS_TO_PASS test's status): present when the report
says ``resolved`` (true or false), else null.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from polar_cli.models import TaskRequest

TEXT_FIELDS = ("instance_id", "repo", "problem_statement", "base_commit", "version")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
COLUMNS = (*TEXT_FIELDS[1:], *TEST_LISTS)
"""The instance columns besides ``instance_id`` (one of the ids every row has)."""


def _tests(value: Any) -> list[str] | None:
    """A test list as SWE-Gym stores it (a list) or SWE-bench does (JSON text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            return None
    return [str(t) for t in value] if isinstance(value, list | tuple) else None


def _text(value: Any) -> str | None:
    return None if value is None or isinstance(value, Mapping | list) else str(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def instance_fields(task: TaskRequest) -> dict[str, Any]:
    """The task's instance fields (``instance_id`` and :data:`COLUMNS`), None where it has none."""
    attached = task.evaluator.config.get("instance")
    sources = [task.metadata, attached if isinstance(attached, Mapping) else {}]
    fields: dict[str, Any] = {}
    for name in TEXT_FIELDS:
        fields[name] = next((_text(s[name]) for s in sources if s.get(name) is not None), None)
    for name in TEST_LISTS:
        fields[name] = next((t for s in sources if (t := _tests(s.get(name))) is not None), None)
    return fields


def session_fields(fields: Mapping[str, Any], evaluation: Any) -> dict[str, Any]:
    """The ``messages`` columns of one session: the task's instance :data:`COLUMNS` (what the task lacks filled from
    the evaluator's report), ``resolved`` and ``grade``."""
    report = _mapping(evaluation)
    columns = {name: fields.get(name) for name in COLUMNS}
    for name in TEXT_FIELDS[1:]:
        if columns[name] is None:
            columns[name] = _text(report.get(name))
    graded = _mapping(report.get("tests"))
    for name in TEST_LISTS:
        if columns[name] is None and isinstance(graded.get(name), Mapping):
            columns[name] = [str(t) for t in graded[name]]
    resolved = report.get("resolved")
    if not isinstance(resolved, bool):
        return {**columns, "resolved": None, "grade": None}
    tests = _mapping(report.get("tests"))
    grade: dict[str, Any] = {"patch_applied": report.get("patch_applied"), "reason": _text(report.get("reason"))}
    for name in TEST_LISTS:
        statuses = _mapping(tests.get(name))
        failing = report.get(f"{name.lower()}_failing")
        failed = len(failing) if isinstance(failing, list) else 0
        grade[name] = [{"test": str(t), "status": str(s)} for t, s in statuses.items()]
        grade[f"{name.lower()}_total"] = len(statuses)
        grade[f"{name.lower()}_passed"] = len(statuses) - failed
    return {**columns, "resolved": resolved, "grade": grade}
