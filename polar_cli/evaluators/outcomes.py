"""Parsing test outcomes out of a test command's output (pytest lines) or a JUnit XML report."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from polar_cli.errors import EvaluationError

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `pytest -rA` short summary: "PASSED tests/x.py::t", "FAILED tests/x.py::t - AssertionError: ..."
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)(?: - .*)?$")
# `pytest -v`: "tests/x.py::t PASSED   [ 50%]"
_VERBOSE = re.compile(r"^(.+?::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?:\s+\[\s*\d+%\])?$")
JUNIT_MAX_BYTES = 32 * 1024 * 1024


def parse_pytest_output(text: str) -> dict[str, str]:
    """Test id -> outcome from pytest ``-rA`` summary and ``-v`` progress lines; the last report of a test wins."""
    outcomes: dict[str, str] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        match = _SUMMARY.match(line)
        if match:
            outcomes[match.group(2).strip()] = match.group(1)
            continue
        match = _VERBOSE.match(line)
        if match:
            outcomes[match.group(1).strip()] = match.group(2)
    return outcomes


def parse_junit_xml(data: bytes) -> dict[str, str]:
    """Test id -> outcome from a JUnit XML report; the id is ``classname::name`` (just ``name`` without a classname)."""
    if len(data) > JUNIT_MAX_BYTES:
        raise EvaluationError(f"JUnit report is larger than {JUNIT_MAX_BYTES} bytes")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise EvaluationError(f"JUnit report is not valid XML: {exc}") from exc
    outcomes: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        test_id = f"{classname}::{name}" if classname else name
        if case.find("failure") is not None:
            outcomes[test_id] = "FAILED"
        elif case.find("error") is not None:
            outcomes[test_id] = "ERROR"
        elif case.find("skipped") is not None:
            outcomes[test_id] = "SKIPPED"
        else:
            outcomes[test_id] = "PASSED"
    return outcomes
