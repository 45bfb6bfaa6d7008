"""``polar doctor`` in the docker runtime on a real engine: the shell harness and one npm harness (pi)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from polar_cli.harnesses.doctor import DoctorReport
from polar_cli.harnesses.testing import describe

pytestmark = [pytest.mark.harness, pytest.mark.docker]


@pytest.mark.parametrize("name", ["shell", "pi"])
def test_doctor_passes_in_docker(doctor: Callable[..., DoctorReport], docker_image: str, name: str) -> None:
    report = doctor(name, "docker")
    assert report.ok, describe(report)
    assert len(report.completions) == 2
