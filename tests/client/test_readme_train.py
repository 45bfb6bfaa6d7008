"""The README's "Train with Polar" section, in its order and as written: ``polar serve --script ...`` (on a free port),
the ``polar submit`` and ``polar status`` lines, then the Python ``PolarClient`` snippet, which submits the same task
file again (a task file without a task_id is a new task each time: no 409)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.server.procs import REPO, Serve
from tests.support.readme import polar_commands, readme_block

TRAIN_ON = """
collected = []


def train_on(traces, reward):  # the trainer's step, here: keep what it was given
    collected.append({"traces": len(traces), "reward": reward})

"""


def test_the_readme_train_section_runs_in_order(tmp_path: Path) -> None:
    serve_line, *commands = polar_commands(readme_block("Train with Polar", "bash"))
    assert serve_line[:2] == ["polar", "serve"]
    assert [c[1] for c in commands] == ["submit", "status"]
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the README's relative paths, from a scratch directory
    serve = Serve(tmp_path / "polar-data", *serve_line[2:], "--port", "0", default_data_dir=True)
    try:
        info = asyncio.run(serve.ready())
        env = {**os.environ, "PYTHONPATH": str(REPO), "POLAR_SERVER": info["url"], "POLAR_TOKEN": info["token"],
               "COLUMNS": "200"}  # fmt: skip
        runs = [subprocess.run([sys.executable, "-m", "polar_cli", *command[1:]], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300) for command in commands]  # fmt: skip
        for command, run in zip(commands, runs, strict=True):
            assert run.returncode == 0, (command, run.stdout, run.stderr)
        assert "completed, 4 completed, 0 failed of 4" in runs[0].stderr
        program = TRAIN_ON + readme_block("Train with Polar", "python") + "\nprint(json.dumps(collected))\n"
        snippet = subprocess.run([sys.executable, "-c", "import json\n" + program], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        serve.stop()
    assert snippet.returncode == 0, snippet.stderr
    state, collected = snippet.stdout.splitlines()
    assert state == "completed" and json.loads(collected) == [{"traces": 1, "reward": 1.0}]
    assert "completed" in runs[1].stdout and "healthy" in runs[1].stdout  # polar status: the two tasks, the node
    assert not (tmp_path / "None").exists()
