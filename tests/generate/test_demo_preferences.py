"""The ``demo`` dataset's mixed-reward scripts, with the real pi CLI and the scripted backend: ``polar generate
--samples 2`` gives each task an accepted and a rejected session, and ``polar export`` a ``preferences`` config that
``datasets.load_dataset`` reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar_cli.datasets.demo import TASKS
from polar_cli.generate import open_ledger
from polar_cli.harnesses.testing import require_cli

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]
PICKED = ["hello-file", "count-lines"]  # one solved by sample 0, one whose sample 0 is the wrong answer


def polar(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(cwd / "hf-cache")}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_demo_generate_with_two_samples_exports_a_preference_pair_per_task(tmp_path: Path) -> None:
    require_cli("pi")
    generated = polar(["generate", "--harness", "pi", "--dataset", "demo", "-O", f"tasks=[{', '.join(PICKED)}]",
                       "--backend", "scripted", "--samples", "2", "--out", "rollouts"], tmp_path)  # fmt: skip
    assert generated.returncode == 0, generated.stdout + generated.stderr
    with open_ledger(tmp_path / "rollouts", must_exist=True) as ledger:
        rows = {(r.task_id, r.sample_index): (r.status, r.accepted) for r in ledger.rows()}
    assert rows == {  # the variants cycle: sample 0 plays the first, sample 1 the second
        ("demo-hello-file", 0): ("completed", True), ("demo-hello-file", 1): ("completed", False),
        ("demo-count-lines", 0): ("completed", False), ("demo-count-lines", 1): ("completed", True),
    }  # fmt: skip
    exported = polar(["export", "rollouts", "--to", "dataset", "--json"], tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["configs"]["preferences"] == {"train": 2}

    import datasets

    pairs = datasets.load_dataset(str(tmp_path / "dataset"), "preferences", cache_dir=str(tmp_path / "hf-cache"))
    assert pairs["train"].num_rows == 2
    for row in pairs["train"]:
        name = row["task_id"].removeprefix("demo-")
        assert name in PICKED and row["chosen_reward"] == 1.0 and row["rejected_reward"] == 0.0
        assert row["prompt"][-1] == {**row["prompt"][-1], "role": "user", "content": TASKS[name][1]}
        right, wrong = (1, 0) if name == "count-lines" else (0, 1)
        chosen_calls = [c["function"]["name"] for m in row["chosen"] if m["role"] == "assistant"
                        for c in m["tool_calls"] or []]  # fmt: skip
        assert chosen_calls == [c["function"]["name"] for t in TASKS[name][4][right] for c in t.get("tool_calls", [])]
        assert row["chosen"] != row["rejected"] and len(TASKS[name][4][wrong]) >= 2
