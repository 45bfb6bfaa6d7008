"""A real ``polar serve`` (server + embedded gateway, scripted backend) as a subprocess on 127.0.0.1, per module."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

TOKEN = "client-tests-token"


@dataclass(frozen=True)
class Served:
    url: str
    token: str
    data_dir: Path


def start_serve(data_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``polar serve`` on a free port (its output in ``log_path``); its URL (from the ``POLAR_SERVE`` line it prints)
    once ``/healthz`` answers."""
    cmd = [sys.executable, "-m", "polar_cli", "serve", "--port", "0", "--token", TOKEN, "--data-dir", str(data_dir)]
    env = {**os.environ, "POLAR_LOAD_PLUGINS": ""}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + 60
    while time.monotonic() < end and proc.poll() is None:
        match = re.search(r"^POLAR_SERVE .*?\burl=(\S+)", log_path.read_text(errors="replace"), re.MULTILINE)
        if match:
            try:
                if httpx.get(f"{match.group(1)}/healthz").status_code == 200:
                    return proc, match.group(1)
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"polar serve did not come up:\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("serve")
    proc, url = start_serve(root / "data", root / "serve.log")
    try:
        yield Served(url, TOKEN, root / "data")
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
