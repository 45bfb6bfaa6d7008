"""``polar proxy`` as its own process (so a test can read its memory, or ``kill -9`` it), started with no installed
plugin loaded; its URL is read from the first line it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def start_proxy(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Start ``polar proxy --port 0 ARGS``; the process and the URL it serves on."""
    cmd = [sys.executable, "-m", "polar_cli", "proxy", "--port", "0", *args]
    env = {**os.environ, "POLAR_LOAD_PLUGINS": ""}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"Polar proxy on (http://\S+)", line)
    assert match, line
    return proc, match.group(1)
