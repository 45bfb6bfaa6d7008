from __future__ import annotations

import json
import os
import subprocess
import sys

from polar_cli.registry import LOAD_ENV


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "swebench"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    rows = {(row["kind"], row["name"]): row["package"] for row in json.loads(out.stdout)}
    assert rows[("evaluator", "swebench_harness")] == "polar-swebench"
    assert rows[("dataset", "swegym")] == "polar-swebench"
    assert rows[("dataset", "swebench_verified")] == "polar-swebench"
    assert rows[("dataset", "skyrl_swegym")] == "polar-swebench"
