"""One ``polar serve`` per data dir (real processes): a second is refused naming the first's pid and URL, and a
server killed with SIGKILL leaves no lock behind. Also what the banner hands the user: a pasteable export line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.client.conftest import TOKEN, start_serve, stop


def serve_again(data_dir: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "polar_cli", "serve", "--port", "0", "--data-dir", str(data_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "POLAR_LOAD_PLUGINS": ""},
                          timeout=120)  # fmt: skip


def test_a_second_serve_on_one_data_dir_is_refused_and_a_killed_one_does_not_block(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first, url = start_serve(data_dir, tmp_path / "first.log")
    try:
        second = serve_again(data_dir)
        assert second.returncode == 2, second.stderr
        error = second.stderr.strip()
        assert error.startswith(f"Error: data dir {data_dir} is in use by another polar serve"), error
        assert f"pid {first.pid}" in error and url in error and "--data-dir" in error
        assert url in (data_dir / "serve.json").read_text()  # not overwritten by the refused one
    finally:
        first.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
        first.wait()
    again, again_url = start_serve(data_dir, tmp_path / "again.log")
    try:
        assert again.poll() is None and again_url
    finally:
        stop(again)


def test_the_banner_has_a_pasteable_export_line_and_a_submit_example(tmp_path: Path) -> None:
    proc, url = start_serve(tmp_path / "data", tmp_path / "serve.log")
    try:
        banner = (tmp_path / "serve.log").read_text()
    finally:
        stop(proc)
    export = next(line.strip() for line in banner.splitlines() if line.strip().startswith("export "))
    shown = subprocess.run(["bash", "-c", f"{export}\necho $POLAR_SERVER $POLAR_TOKEN"], capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    assert shown == [url, TOKEN]
    assert re.search(r"^\s*polar submit \S+ --wait", banner, re.MULTILINE), banner
    assert "curl" not in banner and f"server token: {TOKEN}" in banner
