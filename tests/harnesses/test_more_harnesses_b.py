"""openclaw, grok_cli and nanocoder with their real CLIs: ``polar doctor`` passes every step, and ``polar run``
(scripted backend) completes a multi-turn task whose trajectory passes ``verify``, its streamed calls passed through.

openclaw and nanocoder stream every call; grok_cli's headless mode (``--prompt``) makes plain calls only, so it has
none to check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polar_cli.harnesses.doctor import DoctorReport
from polar_cli.harnesses.testing import check_run, check_streamed, describe, in_ci, missing_cli_reason, polar_run
from polar_cli.registry import get_harness

HARNESSES = ["openclaw", "grok_cli", "nanocoder"]

pytestmark = pytest.mark.harness


@pytest.mark.parametrize("name", HARNESSES)
def test_doctor_passes(doctor: Callable[..., DoctorReport], name: str) -> None:
    report = doctor(name)
    assert report.ok, describe(report)
    generations = [r for r in report.requests if r.kind == "generate"]
    assert len(report.completions) == len(generations) == 2, describe(report)


@pytest.mark.parametrize("name", HARNESSES)
def test_polar_run_completes_with_a_verified_trajectory(tmp_path: Path, name: str) -> None:
    reason = missing_cli_reason(get_harness(name))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    report = polar_run(name, tmp_path)
    check_run(report)
    if name == "grok_cli":
        assert not any(c.metadata.get("stream") for c in report.completions), report.describe()
    else:
        check_streamed(report)
