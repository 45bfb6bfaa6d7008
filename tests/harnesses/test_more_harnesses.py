"""The npm harnesses added after the first seven, with their real CLIs: ``polar doctor`` passes every step (the
completions are exactly its two generation calls), and ``polar run`` (scripted backend) completes a multi-turn task
whose trajectory passes ``verify``, its streamed calls passed through.

Every one of them streams every call but grok_cli, whose headless mode (``--prompt``) makes plain calls only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polar_cli.harnesses.doctor import DoctorReport
from polar_cli.harnesses.testing import check_run, check_streamed, describe, polar_run, require_cli

HARNESSES = ["cline", "kilocode", "continue_cli", "openclaw", "grok_cli", "nanocoder"]
NOT_STREAMED = {"grok_cli"}

pytestmark = pytest.mark.harness


@pytest.mark.parametrize("name", HARNESSES)
def test_doctor_passes_with_exactly_the_generation_calls(doctor: Callable[..., DoctorReport], name: str) -> None:
    report = doctor(name)
    assert report.ok, describe(report)
    generations = [r for r in report.requests if r.kind == "generate"]
    assert len(report.completions) == len(generations) == 2, describe(report)


@pytest.mark.parametrize("name", HARNESSES)
def test_polar_run_completes_streamed_and_verified(tmp_path: Path, name: str) -> None:
    require_cli(name)
    report = polar_run(name, tmp_path)
    check_run(report)
    if name in NOT_STREAMED:
        assert not any(c.metadata.get("stream") for c in report.completions), report.describe()
    else:
        check_streamed(report)
