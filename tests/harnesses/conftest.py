"""Real-CLI harness tests: run each CLI once per test session through ``polar doctor`` (cached reports)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from polar_cli.harnesses.doctor import DEFAULT_IMAGE, DoctorReport
from polar_cli.harnesses.testing import doctor_report, in_ci, missing_cli_reason
from polar_cli.registry import get_harness


@pytest.fixture
def doctor() -> Callable[..., DoctorReport]:
    """``doctor(name, runtime="local")``: the cached report; a missing CLI skips (fails under CI)."""

    def get(name: str, runtime: str = "local") -> DoctorReport:
        reason = missing_cli_reason(get_harness(name))
        if reason:
            if in_ci():
                pytest.fail(reason)
            pytest.skip(reason)
        return doctor_report(name, runtime)

    return get


@pytest.fixture(scope="module")
def docker_image() -> str:
    """The doctor's default image on a live engine; skip when .ci/setup_docker.sh recorded that none can start here."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    marker = Path(os.environ.get("POLAR_DOCKER_UNAVAILABLE") or cache / "polar" / "docker-unavailable")
    if marker.is_file():
        pytest.skip(f"no Docker Engine could start here: {marker.read_text().strip()}")
    from polar_cli.runtimes.docker import docker_client

    try:
        client = docker_client()
        client.images.get(DEFAULT_IMAGE)
        client.close()
    except Exception as exc:  # RuntimeFailure, or the image is missing
        reason = f"no Docker Engine with {DEFAULT_IMAGE} ({exc}); run .ci/setup_docker.sh"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return DEFAULT_IMAGE
