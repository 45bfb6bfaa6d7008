"""cline, kilocode and continue_cli with their real CLIs: ``polar doctor`` passes every step (one run per CLI per test
session), and ``polar run`` with the scripted backend completes, its streamed calls passed through and its trajectory
verified."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polar_cli.harnesses.doctor import DoctorReport
from polar_cli.harnesses.testing import (
    check_run,
    check_streamed,
    describe,
    in_ci,
    missing_cli_reason,
    polar_run,
)
from polar_cli.registry import get_harness

HARNESSES = ["cline", "kilocode", "continue_cli"]

pytestmark = pytest.mark.harness


@pytest.mark.parametrize("name", HARNESSES)
def test_doctor_passes_with_exactly_the_generation_calls(doctor: Callable[..., DoctorReport], name: str) -> None:
    report = doctor(name)
    assert report.ok, describe(report)
    generations = [r for r in report.requests if r.kind == "generate"]
    assert len(report.completions) == len(generations) == 2, describe(report)


@pytest.mark.parametrize("name", HARNESSES)
def test_polar_run_completes_streamed_and_verified(tmp_path: Path, name: str) -> None:
    reason = missing_cli_reason(get_harness(name))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    report = polar_run(name, tmp_path)
    check_run(report)
    check_streamed(report)
