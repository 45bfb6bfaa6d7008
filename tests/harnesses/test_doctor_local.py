"""``polar doctor`` with each built-in harness's real CLI in the local runtime (one run per CLI per test session)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from polar_cli.harnesses.doctor import DOCTOR_INSTRUCTION, DoctorReport
from polar_cli.harnesses.testing import describe

HARNESSES = ["shell", "pi", "qwen_code", "gemini_cli", "opencode"]

pytestmark = pytest.mark.harness


@pytest.mark.parametrize("name", HARNESSES)
def test_doctor_passes(doctor: Callable[..., DoctorReport], name: str) -> None:
    report = doctor(name)
    assert report.ok, describe(report)


@pytest.mark.parametrize("name", HARNESSES)
def test_completions_are_exactly_the_generation_calls(doctor: Callable[..., DoctorReport], name: str) -> None:
    report = doctor(name)
    generations = [r for r in report.requests if r.kind == "generate"]
    assert len(report.completions) == len(generations) == 2, describe(report)
    assert [c["index"] for c in report.completions] == [0, 1]


@pytest.mark.parametrize("name", HARNESSES)
def test_hostile_instruction_arrives_verbatim_and_runs_nothing(doctor: Callable[..., DoctorReport], name: str) -> None:
    report = doctor(name)
    assert all(part in DOCTOR_INSTRUCTION for part in ("$(touch", "`touch", "'", '"', "\n", "\\\n"))
    assert DOCTOR_INSTRUCTION.startswith("--")
    assert report.step("instruction verbatim").status == "pass", describe(report)
    assert report.step("nothing injected").status == "pass", describe(report)
