"""The SWE datasets offline: local files shaped like real SWE-Gym, SWE-bench Verified and SkyRL-v0-293-data rows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polar_swebench.images import image_name

from polar_cli.errors import ConfigError, HubError
from polar_cli.registry import LOAD_ENV, get_dataset, get_evaluator

PATCH = "diff --git a/moto/s3/models.py b/moto/s3/models.py\n--- a/moto/s3/models.py\n+++ b/moto/s3/models.py\n"

# SWE-Gym/SWE-Gym: test lists are lists, no environment_setup_commit
SWEGYM_ROWS = [
    {
        "instance_id": "getmoto__moto-7365", "repo": "getmoto/moto", "base_commit": "7f6c9cb1deafb280fe7fcc7551c38e39",
        "version": "5.0", "patch": PATCH, "test_patch": PATCH.replace("moto/s3", "tests/test_s3"),
        "problem_statement": "DynamoDB's `update_item` performs floating-point arithmetic with mock table created",
        "hints_text": "", "created_at": "2024-02-19 20:29:03",
        "FAIL_TO_PASS": ["tests/test_dynamodb/test_dynamodb_update_expressions.py::test_update_item_add_float"],
        "PASS_TO_PASS": ["tests/test_dynamodb/test_dynamodb_update_expressions.py::test_update_different_map"],
    },
    {
        "instance_id": "python__mypy-15845", "repo": "python/mypy", "base_commit": "cfd01d9f7fdceb5eb8e367e8f1a6a1ef",
        "version": "1.6", "patch": PATCH, "test_patch": PATCH, "problem_statement": "Crash on walrus in comprehension",
        "hints_text": "", "created_at": "2023-08-10 20:53:10",
        "FAIL_TO_PASS": ["mypy/test/testcheck.py::TypeCheckSuite::check-python38.test::testWalrusInComprehension"],
        "PASS_TO_PASS": [],
    },
]  # fmt: skip
F2P_ASTROPY = "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
# princeton-nlp/SWE-bench_Verified: test lists are JSON strings, environment_setup_commit added
VERIFIED_ROW = {
    "repo": "astropy/astropy", "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4e",
    "patch": PATCH, "test_patch": PATCH, "problem_statement": "Modeling's `separability_matrix` does not compute "
    "separability correctly for nested CompoundModels", "hints_text": "", "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3", "FAIL_TO_PASS": json.dumps([F2P_ASTROPY]),
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752", "difficulty": "15 min - 1 hour",
}  # fmt: skip


def tasks(name: str, **config: Any) -> list[Any]:
    return list(get_dataset(name).tasks(**config))


def test_swegym_rows_become_tasks_with_swegym_image_names(tmp_path: Path) -> None:
    path = tmp_path / "swe-gym.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in SWEGYM_ROWS))
    first, second = tasks("swegym", path=str(path), harness="pi", num_samples=4)
    assert first.task_id == "getmoto__moto-7365" and first.num_samples == 4
    assert first.runtime.backend == "docker" and first.runtime.workdir == "/testbed"
    assert first.runtime.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest"
    assert second.runtime.image == "xingyaoww/sweb.eval.x86_64.python_s_mypy-15845:latest"
    assert first.metadata["repo"] == "getmoto/moto" and first.metadata["instance_id"] == "getmoto__moto-7365"
    assert "floating-point arithmetic" in first.instruction and "/testbed" in first.instruction
    assert first.agent.harness == "pi" and first.timeout_seconds == 3600
    evaluator = first.evaluator
    assert (evaluator.strategy, evaluator.refresh_runtime) == ("swebench_harness", True)
    instance = evaluator.config["instance"]
    assert instance["FAIL_TO_PASS"] == SWEGYM_ROWS[0]["FAIL_TO_PASS"]
    assert instance["created_at"] == "2024-02-19 20:29:03"


def test_swebench_verified_rows_and_the_same_instance_on_apptainer(tmp_path: Path) -> None:
    path = tmp_path / "verified.json"
    path.write_text(json.dumps([VERIFIED_ROW]))
    (task,) = tasks("swebench_verified", path=str(path))
    assert task.runtime.image == "xingyaoww/sweb.eval.x86_64.astropy_s_astropy-12907:latest"
    instance = task.evaluator.config["instance"]
    assert instance["FAIL_TO_PASS"] == [F2P_ASTROPY]
    assert instance["environment_setup_commit"] == VERIFIED_ROW["environment_setup_commit"]
    (on_hpc,) = tasks("swebench_verified", path=str(path), backend="apptainer")
    assert on_hpc.runtime.backend == "apptainer"
    assert on_hpc.runtime.image == "docker://xingyaoww/sweb.eval.x86_64.astropy_s_astropy-12907:latest"
    assert on_hpc.evaluator == task.evaluator and on_hpc.instruction == task.instruction
    (own,) = tasks("swebench_verified", path=str(path), image_template="registry.local/sweb/{image_id}:v2")
    assert own.runtime.image == "registry.local/sweb/astropy_s_astropy-12907:v2"


def test_skyrl_rows_nest_the_instance_in_a_parquet_folder(tmp_path: Path) -> None:
    """SkyRL-v0-293-data: train.parquet and validation.parquet, each row's 'instance' column a SWE-Gym instance."""
    rows = [{"data_source": "swe-gym", "instance": row} for row in SWEGYM_ROWS]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "validation.parquet")
    train = tasks("skyrl_swegym", path=str(tmp_path), split="train")
    assert [t.task_id for t in train] == ["getmoto__moto-7365", "python__mypy-15845"]
    assert train[1].runtime.image == image_name("python__mypy-15845")
    assert train[1].evaluator.config["instance"]["PASS_TO_PASS"] == []
    assert [t.task_id for t in tasks("skyrl_swegym", path=str(tmp_path), split="validation")] == ["getmoto__moto-7365"]
    assert [t.task_id for t in tasks("skyrl_swegym", path=str(tmp_path), instance_ids=["python__mypy-15845"])] == [
        "python__mypy-15845"
    ]
    assert len(tasks("skyrl_swegym", path=str(tmp_path), split="train", limit=1)) == 1
    with pytest.raises(ConfigError, match=r"'instance' column"):
        tasks("skyrl_swegym", path=_flat(tmp_path))


def _flat(tmp_path: Path) -> str:
    path = tmp_path / "flat.jsonl"
    path.write_text(json.dumps(SWEGYM_ROWS[0]) + "\n")
    return str(path)


def test_the_tasks_evaluator_config_checks_and_a_repo_nobody_knows_is_refused(tmp_path: Path) -> None:
    """SWE-Gym rows without an eval_script get SWE-Gym's script from Polar's own facts (no swegym package); a row of a
    repo no table knows is refused up front."""
    path = tmp_path / "swe-gym.jsonl"
    path.write_text(json.dumps(SWEGYM_ROWS[0]) + "\n" + json.dumps({**SWEGYM_ROWS[0], "repo": "someone/unknown"}))
    known, unknown = tasks("swegym", path=str(path))
    get_evaluator("swebench_harness").check_config(known.evaluator.config)
    with pytest.raises(ConfigError, match=r"no eval_script.*none of SWE-Gym's"):
        get_evaluator("swebench_harness").check_config(unknown.evaluator.config)


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown field 'imag_prefix'.*did you mean 'image_prefix'"):
        tasks("swegym", path=str(tmp_path), imag_prefix="x")
    with pytest.raises(ConfigError, match=r"does not exist"):
        tasks("swegym", path=str(tmp_path / "missing"))
    row = {**SWEGYM_ROWS[0]}
    del row["repo"]
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"row 0.*repo"):
        tasks("swegym", path=str(tmp_path / "bad.jsonl"))


def test_offline_mode_without_a_cached_copy_names_the_local_file_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HF_HUB_OFFLINE`` and nothing in the datasets cache: one line naming ``-O path=``, no hub call."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(HubError) as info:
        tasks("swegym")
    message = str(info.value)
    assert "\n" not in message and message.startswith("cannot load SWE-Gym/SWE-Gym (split train) in offline mode: ")
    assert message.endswith("give a local copy: polar generate --dataset swegym -O path=/data/swegym.jsonl "
                            "(a .jsonl/.json/.parquet file or a folder of them)")  # fmt: skip


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("name,hub_id", [("swegym", "SWE-Gym/SWE-Gym"),
                                         ("swebench_verified", "princeton-nlp/SWE-bench_Verified"),
                                         ("skyrl_swegym", "NovaSky-AI/SkyRL-v0-293-data")])  # fmt: skip
def test_every_hub_dataset_without_a_hub_is_one_line_within_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, hub_id: str
) -> None:
    """The hub at a closed port (the one thing faked: there is no hub here): one HubError, within seconds rather than
    the library's ~24 s of retries, naming the dataset's ``path`` option with an example."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    start = time.monotonic()
    with pytest.raises(HubError) as info:
        tasks(name)
    message = str(info.value)
    assert "\n" not in message and time.monotonic() - start < 10
    assert message.startswith("cannot reach the HuggingFace Hub at http://127.0.0.1:") and hub_id in message
    assert f"polar generate --dataset {name} -O path=/data/{name}.jsonl" in message


def test_polar_generate_swegym_without_a_hub_says_so_in_one_line(tmp_path: Path) -> None:
    """The user's own command, as a process: one error line within seconds (besides generate's progress line), no
    retry warnings, naming ``-O path=``; nothing is written."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE") and k != LOAD_ENV}
    root = Path(__file__).resolve().parents[3]
    env.update({"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf"),
                "PYTHONPATH": os.pathsep.join([str(root), str(root / "plugins" / "polar-swebench")])})  # fmt: skip
    start = time.monotonic()
    command = ["generate", "--harness", "pi", "--dataset", "swegym", "--out", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-m", "polar_cli", *command], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    seconds = time.monotonic() - start
    assert done.returncode == 3 and seconds < 20, done.stderr  # docs/cli.md: the Hub cannot be reached
    said = [line for line in done.stderr.splitlines() if not line.startswith("generate ")]  # the progress line
    assert len(said) == 1 and said[0].startswith("Error: cannot reach the HuggingFace Hub"), done.stderr
    assert "-O path=/data/swegym.jsonl" in said[0]
    assert not any(noise in done.stderr for noise in ("Retrying", "thrown while requesting", "Traceback"))
