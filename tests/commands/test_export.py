"""``polar export`` as a user runs it: the table and the load hint, whose code runs as printed with the real
``datasets``, and ``--json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar_cli.generate.ledger import Ledger, ResultRow
from polar_cli.models import SessionResult, TaskRequest, Trace, Trajectory

ROOT = Path(__file__).resolve().parents[2]


def generated_folder(folder: Path, sessions: int = 3) -> Path:
    """A real ``polar generate`` output folder with ``sessions`` finished sessions (one trace each)."""
    with Ledger(folder) as ledger:
        for i in range(sessions):
            repo = f"r{i % 2}"
            task = TaskRequest(task_id=f"t{i}", instruction="x", agent={"harness": "pi"}, metadata={"repo": repo})
            trace = Trace(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 0],
                          response_logprobs=[{"token": "a", "token_id": 3, "logprob": -0.5},
                                             {"token": None, "token_id": 4, "logprob": 0.0}])  # fmt: skip
            trajectory = Trajectory(status="completed", traces=[trace])
            result = SessionResult(session_id=f"s{i}", task_id=task.task_id, status="completed", reward=1.0,
                                   num_completions=1, trajectory=trajectory)  # fmt: skip
            ledger.remember_task(i, repo, task)
            row = ResultRow(task.task_id, 0, f"s{i}", repo, 1, "completed", 1.0, True, 1, 4, 1, 1)
            assert ledger.finish(row, result)
    return folder


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Offline, with a datasets cache of the test's own (the default one is shared and keyed on folder names)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"),
            "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}  # fmt: skip


def test_export_prints_a_table_and_a_load_hint_whose_code_runs(tmp_path: Path, env: dict[str, str]) -> None:
    work = tmp_path / "work"
    generated_folder(work / "rollouts")
    done = run(["-m", "polar_cli", "export", "rollouts", "--to", "my dataset"], work, env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("traces" in line and "train" in line and "3" in line for line in lines)
    load = next(line for line in lines if line.startswith("load it: "))
    push = next(line for line in lines if line.startswith("push it: "))
    assert "pip install 'polar-rl[hf]'" in load
    assert push == "push it: polar push-hub 'my dataset' USER/NAME"
    assert done.stderr.splitlines() == [
        "polar export: reading rollouts",
        *[f"polar export: writing 3 sessions ({i}/3)" for i in range(4)],
        "polar export: writing the dataset card",
        "polar export: done: 4 files in my dataset",
        "note: preferences has no rows, so the card lists no 'preferences' config (datasets cannot load a config with "
        "no rows: load_dataset(..., 'preferences') answers that it is not found)",
    ]
    code = load.removeprefix("load it: ")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    loaded = run(["-c", f"{code}\nprint(traces['train'].num_rows, traces['train'][0]['response_logprobs'])"],
                 elsewhere, env)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[0] == "3" and "[-0.5, 0.0]" in loaded.stdout


def test_export_json_is_one_document_on_stdout(tmp_path: Path, env: dict[str, str]) -> None:
    generated_folder(tmp_path / "rollouts")
    args = ["-m", "polar_cli", "export", "rollouts", "--to", "ds", "--test-size", "0.5", "--json"]
    done = run(args, tmp_path, env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["out"] == str(tmp_path / "ds") and report["source"] == str(tmp_path / "rollouts")
    assert report["configs"] == {"traces": {"train": 2, "test": 1}, "messages": {"train": 2, "test": 1},
                                 "preferences": {"train": 0}}
    assert "README.md" in report["files"] and "traces/train-00000.parquet" in report["files"]
    steps, hints = done.stderr.splitlines()[:-2], done.stderr.splitlines()[-2:]
    assert steps[0] == "polar export: reading rollouts" and all(s.startswith("polar export: ") for s in steps)
    assert [line.split(":")[0] for line in hints] == ["load it", "push it"]


def test_configs_and_splits_without_rows_stay_out_of_the_card_so_every_listed_one_loads(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """``datasets`` cannot load a split with no rows (``Instruction "train" corresponds to no data!``): a card that
    listed ``preferences`` with 0 rows, or a ``test`` split with none, made ``load_dataset`` of it raise ValueError."""
    from polar_cli.export.card import dataset_card, loadable_splits

    splits = {"traces": {"train": 2, "test": 1}, "messages": {"train": 2, "test": 1}, "preferences": {"train": 0}}
    assert loadable_splits(splits) == {"traces": {"train": 2, "test": 1}, "messages": {"train": 2, "test": 1}}
    mixed = {"traces": {"train": 2, "test": 1}, "preferences": {"train": 1, "test": 0}}
    assert loadable_splits(mixed) == {"traces": {"train": 2, "test": 1}, "preferences": {"train": 1}}
    card = dataset_card(license="other", splits=mixed, stats=[], group_by="repo", per_split={}, source="x",
                        filters="every session")  # fmt: skip
    assert "preferences/test-*" not in card and "preferences/train-*" in card

    generated_folder(tmp_path / "rollouts")  # every session accepted: no pair, 0 preferences rows
    done = run(["-m", "polar_cli", "export", "rollouts", "--to", "ds", "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["configs"]["preferences"] == {"train": 0}
    code = ("import datasets, json, sys\n"
            "names = datasets.get_dataset_config_names('ds')\n"
            "rows = {n: {s: d.num_rows for s, d in datasets.load_dataset('ds', n).items()} for n in names}\n"
            "print(json.dumps(rows))\n")  # fmt: skip
    loaded = run(["-c", code], tmp_path, env)
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout) == {"traces": {"train": 3}, "messages": {"train": 3}}
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "`preferences` has no rows here" in card and 'load_dataset("THIS_DATASET", "preferences")' not in card


def test_a_stratify_field_no_task_has_is_refused_with_a_close_spelling(tmp_path: Path) -> None:
    from polar_cli.errors import ConfigError
    from polar_cli.export import ExportOptions, export

    folder = generated_folder(tmp_path / "rollouts")
    with pytest.raises(ConfigError) as refused:
        export(folder, tmp_path / "ds", ExportOptions(test_size=0.3, stratify_by="repoo"))
    assert str(refused.value) == ("--stratify-by 'repoo': no task has that metadata field (did you mean 'repo'?); "
                                  "their metadata fields: repo, or task_id")  # fmt: skip
    assert not (tmp_path / "ds").exists()
    assert export(folder, tmp_path / "by-task", ExportOptions(stratify_by="task_id")).rows["traces"] == {"train": 3}
    card = (tmp_path / "by-task" / "README.md").read_text()
    assert "task_id" in card


def test_the_default_stratum_falls_back_for_tasks_without_a_repo(tmp_path: Path) -> None:
    """No ``--stratify-by``: ``repo``, and tasks without one export in group ``-`` (nothing is refused)."""
    from polar_cli.export import ExportOptions, export

    with Ledger(tmp_path / "gen") as ledger:
        task = TaskRequest(task_id="t0", instruction="x", agent={"harness": "pi"})
        ledger.remember_task(0, "-", task)
        trajectory = Trajectory(status="completed", traces=[Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1],
                                response_logprobs=[{"token_id": 2, "logprob": -0.5}])])  # fmt: skip
        result = SessionResult(session_id="s0", task_id="t0", status="completed", reward=1.0, trajectory=trajectory)
        assert ledger.finish(ResultRow("t0", 0, "s0", "-", 1, "completed", 1.0, True, 1, 2, 1, 1), result)
    assert export(tmp_path / "gen", tmp_path / "ds", ExportOptions()).rows["traces"] == {"train": 1}
