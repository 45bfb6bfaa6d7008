"""``polar generate`` folders as a user meets them, with the real pi CLI and the scripted backend: the command without
``--out`` (a default folder named after the dataset and harness), a dead backend (refused before the ledger exists),
a folder an earlier failed run left with tasks and no attempt (it does not pin the recipe), and a folder extended by
more samples and more tasks, while a change that would make its rows inconsistent is refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_cli.generate import open_ledger
from polar_cli.generate.ledger import Ledger
from polar_cli.harnesses.testing import in_ci, missing_cli_reason
from polar_cli.models import TaskRequest
from polar_cli.registry import get_harness

pytestmark = pytest.mark.harness
ROOT = Path(__file__).resolve().parents[2]
BASE = ["generate", "--dataset", "demo", "--harness", "pi"]


def polar(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once returned: nothing listens there


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = missing_cli_reason(get_harness("pi"))
    if reason:
        pytest.fail(reason) if in_ci() else pytest.skip(reason)
    cwd = tmp_path_factory.mktemp("folders")
    out = cwd / "demo-pi"
    found: dict[str, Any] = {"cwd": cwd, "out": out}
    found["dead"] = polar([*BASE, "--backend", "vllm", "--backend-url", dead_url(), "--model", "m",
                           "-O", "tasks=[hello-file]"], cwd)  # fmt: skip
    found["ledger_after_dead"] = (out / "ledger.db").exists()
    # what an older Polar's failed run left: a recipe and every task, no attempt
    with Ledger(out) as ledger:
        ledger.check_recipe({"dataset": "demo", "harness": "pi", "builder": "per_request", "samples": 3})
        stale = TaskRequest(task_id="demo-hello-file", instruction="stale", agent={"harness": "pi"})
        ledger.remember_task(0, "x", stale)
    found["first"] = polar([*BASE, "--backend", "scripted", "-O", "tasks=[hello-file]"], cwd)
    with open_ledger(out, must_exist=True) as ledger:
        found["first_rows"] = ledger.rows()
    found["more"] = polar([*BASE, "--backend", "scripted", "--samples", "2", "-O", "tasks=[hello-file, fix-add]"], cwd)
    with open_ledger(out, must_exist=True) as ledger:
        found["more_rows"] = ledger.rows()
    found["other_builder"] = polar([*BASE, "--backend", "scripted", "--builder", "per_request"], cwd)
    found["other_options"] = polar([*BASE, "--backend", "scripted", "-O", "tasks=[hello-file]",
                                    "-O", "timeout_seconds=77"], cwd)  # fmt: skip
    return found


def test_a_dead_backend_is_refused_before_the_ledger_exists(runs: dict[str, Any]) -> None:
    dead = runs["dead"]
    assert dead.returncode == 3, dead.stdout + dead.stderr  # unreachable (docs/cli.md)
    assert "does not answer" in dead.stderr and not runs["ledger_after_dead"]


def test_without_out_the_folder_is_named_after_dataset_and_harness(runs: dict[str, Any]) -> None:
    first = runs["first"]
    assert first.returncode == 0, first.stdout + first.stderr
    assert "output folder: demo-pi (no --out: named after the dataset and harness" in first.stderr
    assert "1 sessions in demo-pi" in first.stdout


def test_a_folder_with_no_attempt_does_not_pin_its_recipe(runs: dict[str, Any]) -> None:
    """The stale recipe (builder per_request) and task (instruction 'stale') left before any attempt are replaced."""
    [row] = runs["first_rows"]
    assert (row.task_id, row.status) == ("demo-hello-file", "completed")
    with open_ledger(runs["out"], must_exist=True) as ledger:
        assert ledger.task("demo-hello-file").instruction != "stale"


def test_more_samples_and_more_tasks_extend_the_folder(runs: dict[str, Any]) -> None:
    more = runs["more"]
    assert more.returncode == 0, more.stdout + more.stderr
    keys = sorted((r.task_id, r.sample_index) for r in runs["more_rows"])
    assert keys == [("demo-fix-add", 0), ("demo-fix-add", 1), ("demo-hello-file", 0), ("demo-hello-file", 1)]
    first = runs["first_rows"][0]
    again = next(r for r in runs["more_rows"] if (r.task_id, r.sample_index) == ("demo-hello-file", 0))
    assert again.session_id == first.session_id  # kept, not run again


def test_a_change_that_would_make_the_rows_inconsistent_is_refused(runs: dict[str, Any]) -> None:
    builder = runs["other_builder"]
    assert builder.returncode == 2
    assert builder.stderr.strip().endswith(
        "demo-pi was generated with builder=None, not 'per_request': its rows would not match the new ones. Re-run "
        "with the same setting to resume or extend it (more --samples and more tasks are fine), or use another --out"
    )
    options = runs["other_options"]
    assert options.returncode == 2
    assert "task demo-hello-file is not the one this folder first ran (timeout_seconds differ)" in options.stderr
