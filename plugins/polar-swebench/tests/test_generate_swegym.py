"""``polar generate --dataset swegym -O path=rows.jsonl`` offline, end to end: the real pi CLI (scripted backend) in
the SWE fixture image, graded by the eval script SWE-Gym's harness writes (from the facts Polar carries, no swegym
package), ``polar export``, and the export loaded with ``datasets.load_dataset`` offline.

The row is a SWE-Gym row of Project-MONAI/MONAI (no ``eval_script`` of its own) whose repository is the fixture's
calc project: its base commit, test patch and tests. SWE-Gym's MONAI script first activates conda and runs MONAI's
install step; the fixture image has neither conda nor pip, so those lines fail in the log and the script goes on (it
runs without ``set -e``, as SWE-Gym's does), and the test command ``pytest -rA <test files>`` runs the fixture's tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar_cli.generate import open_ledger
from polar_cli.harnesses.testing import in_ci, missing_cli_reason
from polar_cli.models import SessionResult
from polar_cli.registry import LOAD_ENV, get_harness

pytestmark = [pytest.mark.docker, pytest.mark.harness]
ROOT = Path(__file__).resolve().parents[3]
INSTANCE_ID = "Project-MONAI__MONAI-1"


def polar(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", LOAD_ENV: "swebench", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins" / "polar-swebench")])}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_polar_generate_swegym_runs_offline_to_an_exported_dataset(
    swe_image: str, swe_fixture: Any, pi_edit_script: list[dict[str, Any]], tmp_path: Path
) -> None:
    reason = missing_cli_reason(get_harness("pi"))
    if reason:
        pytest.fail(reason) if in_ci() else pytest.skip(reason)
    row = {key: value for key, value in swe_fixture.instance.items() if key not in ("eval_script", "log_parser")}
    row.update(instance_id=INSTANCE_ID, repo="Project-MONAI/MONAI", version="1.3")
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    options = {"image_template": swe_image, "timeout_seconds": 300, "eval_timeout_seconds": 120,
               "metadata": {"script": pi_edit_script}}  # fmt: skip
    (tmp_path / "swegym.yaml").write_text(yaml.safe_dump(options))

    command = ["generate", "--dataset", "swegym", "-O", "path=rows.jsonl", "--dataset-config", "swegym.yaml",
               "--harness", "pi", "--backend", "scripted", "--out", "rollouts", "--no-install"]  # fmt: skip
    generated = polar(command, tmp_path)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    with open_ledger(tmp_path / "rollouts", must_exist=True) as ledger:
        ((row_summary, data),) = list(ledger.results())
    assert (row_summary.task_id, row_summary.status, row_summary.accepted) == (INSTANCE_ID, "completed", True)
    evaluation = SessionResult.model_validate_json(data).metadata["evaluation"]
    assert (evaluation["script_source"], evaluation["resolved"]) == ("swegym", True), evaluation
    assert evaluation["tests"]["FAIL_TO_PASS"] == {"tests/test_calc.py::test_add": "PASSED"}
    assert "conda activate testbed" in evaluation["log"] and "+ pytest -rA tests/test_calc.py" in evaluation["log"]

    exported = polar(["export", "rollouts", "--to", "dataset"], tmp_path)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    import datasets

    traces = datasets.load_dataset(str(tmp_path / "dataset"), "traces", cache_dir=str(tmp_path / "hf-cache"))
    rows = [r for split in traces.values() for r in split]
    assert rows and {r["task_id"] for r in rows} == {INSTANCE_ID} and all(r["harness"] == "pi" for r in rows)
    assert all(r["response_ids"] for r in rows)
    messages = datasets.load_dataset(str(tmp_path / "dataset"), "messages", cache_dir=str(tmp_path / "hf-cache"))
    (conversation,) = [r for split in messages.values() for r in split]
    edits = [c["function"]["name"] for m in conversation["messages"] if m["role"] == "assistant"
             for c in m["tool_calls"] or []]  # fmt: skip
    assert edits == ["edit"]
