"""``examples/grpo_tiny`` without matplotlib: it stops before any work, naming what to install, instead of dying in
``plot()`` after every step (``--no-plot`` skips the plot). matplotlib is installed here, so its absence is
simulated: the example runs in a fresh interpreter where ``sys.modules["matplotlib"] = None`` makes importing it fail
as on a machine without it. (The loop itself needs vLLM: tests/examples/test_grpo_tiny.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRPO = ROOT / "examples" / "grpo_tiny" / "grpo.py"
WITHOUT_MATPLOTLIB = (
    "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = [sys.argv[1], *sys.argv[2:]]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run_without_matplotlib(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, str(GRPO), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_without_matplotlib_it_stops_before_any_work_naming_the_install(tmp_path: Path) -> None:
    out = tmp_path / "grpo-out"
    done = run_without_matplotlib("--steps", "1", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        "grpo_tiny plots reward.png with matplotlib, which is not installed: pip install matplotlib (it comes with "
        "Polar's train extra), or pass --no-plot"
    )
    assert not out.exists() and done.stdout == ""  # nothing started: no vLLM, no serve, no step

