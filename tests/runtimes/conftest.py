"""Runtime test helpers: a private scratch root per test, and the Docker engine check for `docker` tests."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from polar_cli.errors import RuntimeFailure
from tests.support.stacks import task_stacks

T = TypeVar("T")
TEST_IMAGE = os.environ.get("POLAR_TEST_IMAGE", "polar-test-base:latest")


def run(coro: Coroutine[Any, Any, T], within: float = 300) -> T:
    """``coro`` on a new event loop; a hang fails the test with every task's stack (it never holds up the suite)."""

    async def bounded() -> T:
        body = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({body}, timeout=within)
        if done:
            return body.result()
        stacks = task_stacks()
        body.cancel()
        raise AssertionError(f"hung for {within:g} s; the tasks:\n{stacks}")

    return asyncio.run(bounded())


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has disappeared (reaping an orphan by init can take a moment)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state == "Z":  # killed, waiting for its parent to reap it: no longer running
            return True
        time.sleep(0.05)
    return False


async def wait_for_file(path: Path, within: float = 10.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


@pytest.fixture
def scratch_root(tmp_path: Path) -> Iterator[Path]:
    """Where sessions' host dirs go; each test checks nothing is left in it."""
    root = tmp_path / "scratch"
    yield root


def _docker_unavailable() -> str | None:
    """The reason .ci/setup_docker.sh recorded for not getting an engine to start, if it did."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    marker = Path(os.environ.get("POLAR_DOCKER_UNAVAILABLE") or cache / "polar" / "docker-unavailable")
    return marker.read_text().strip() if marker.is_file() else None


def _skip_or_fail(reason: str) -> None:
    recorded = _docker_unavailable()
    if recorded:
        pytest.skip(f"no Docker Engine could start here: {recorded}")
    if os.environ.get("CI"):  # the setup script ran and reported an engine: not reaching it is a failure
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> Any:
    """A client for a Docker Engine holding the test image, or a skip saying why (a failure under CI)."""
    from polar_cli.runtimes.docker import docker_client

    try:
        client = docker_client()
    except RuntimeFailure as exc:
        _skip_or_fail(f"no Docker Engine answers ({exc}); run .ci/setup_docker.sh")
    try:
        client.images.get(TEST_IMAGE)
    except Exception:
        client.close()
        _skip_or_fail(f"test image {TEST_IMAGE} missing; run .ci/setup_docker.sh")
    yield client
    client.close()
