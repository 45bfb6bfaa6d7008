"""A plain install (``pip install polar-rl``, no extra) runs every command that needs no extra, and a command that
needs one says which in one line.

The packages the ``hf`` extra brings (pyarrow, datasets, huggingface_hub) are installed here, so each check runs in a
subprocess where a ``sitecustomize`` on ``PYTHONPATH`` makes importing them fail as on a plain install. (CI also
runs the CLI commands in a fresh venv with ``pip install -e .`` only.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar_cli.generate.ledger import Ledger, ResultRow
from polar_cli.models import SessionResult, TaskRequest, Trace, Trajectory
from polar_cli.registry import LOAD_ENV

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIRS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())
BLOCKED = ("pyarrow", "datasets", "huggingface_hub")
HF_EXTRA = "pip install 'polar-rl[hf]'"

SITECUSTOMIZE = f"""
import sys
from importlib.abc import MetaPathFinder


class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""

# Imports every module of polar_cli and of the plugin packages; prints {module: error} for those that fail.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
failed = {}
for package in sys.argv[1:]:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


@pytest.fixture(scope="module")
def plain_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a plain install: the hf extra's packages cannot be imported; this tree's plugins load."""
    site = tmp_path_factory.mktemp("plain-install")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if k != LOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *map(str, PLUGIN_DIRS)])
    env["COLUMNS"] = "120"
    return env


def run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def polar(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run(["-m", "polar_cli", *args], env, cwd)


def test_the_extras_packages_really_cannot_be_imported(plain_env: dict[str, str]) -> None:
    for module in (*BLOCKED, "pyarrow.parquet"):
        done = run(["-c", f"import {module}"], plain_env)
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, module


def test_every_module_imports_but_the_parquet_writer_and_the_verl_loop_which_say_what_to_install(
    plain_env: dict[str, str],
) -> None:
    packages = ["polar_cli", *(next(d.glob("polar_*")).name for d in PLUGIN_DIRS)]
    done = run(["-c", IMPORT_ALL, *packages], plain_env)
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout)
    assert failed == {
        "polar_cli.export.parquet": f"MissingDependencyError: polar export needs pyarrow: {HF_EXTRA}",
        "polar_cli.trainers.verl_loop": "MissingDependencyError: polar_cli.trainers.verl_loop needs verl: "
        "pip install verl==0.9.1",
    }


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["plugins"], ["plugins", "--json"], ["export", "--help"],
             ["push-hub", "--help"], ["view", "--help"], ["generate", "--help"], ["run", "--help"]]
)  # fmt: skip
def test_commands_that_need_no_extra_run(plain_env: dict[str, str], args: list[str]) -> None:
    done = polar(args, plain_env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and done.stdout.strip()


def test_plugins_lists_this_trees_plugins_without_the_extras(plain_env: dict[str, str]) -> None:
    done = polar(["plugins", "--json"], plain_env)
    listed = json.dumps(json.loads(done.stdout))
    for name in ("swebench_harness", "swegym", "hf", "codex", "claude_code"):
        assert f'"{name}"' in listed, name


def generated_folder(folder: Path) -> Path:
    """A real ``polar generate`` output folder with one finished session."""
    trace = Trace(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1],
                  response_logprobs=[{"token": "a", "token_id": 3, "logprob": -0.5}])  # fmt: skip
    result = SessionResult(session_id="s0", task_id="t0", status="completed", reward=1.0, num_completions=1,
                           trajectory=Trajectory(status="completed", traces=[trace]))  # fmt: skip
    with Ledger(folder) as ledger:
        ledger.remember_task(0, "r", TaskRequest(task_id="t0", instruction="x", agent={"harness": "pi"}))
        assert ledger.finish(ResultRow("t0", 0, "s0", "r", 1, "completed", 1.0, True, 1, 3, 1, 1), result)
    return folder


def test_export_names_the_extra_in_one_line(plain_env: dict[str, str], tmp_path: Path) -> None:
    source = generated_folder(tmp_path / "rollouts")
    for json_flag in ([], ["--json"]):
        done = polar(["export", str(source), "--to", str(tmp_path / "dataset"), *json_flag], plain_env)
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr.splitlines() == [f"Error: polar export needs pyarrow: {HF_EXTRA}"]
        assert not (tmp_path / "dataset").exists()


def test_push_hub_names_the_extra_in_one_line(plain_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("exported\n")
    done = polar(["push-hub", str(tmp_path), "user/name", "--token", "t"], plain_env)
    assert done.returncode != 0
    assert done.stderr.splitlines() == [f"Error: polar push-hub needs huggingface_hub: {HF_EXTRA}"]


LOAD = """
import sys
from polar_cli.errors import PolarError
from polar_cli.registry import get_dataset
try:
    next(iter(get_dataset(sys.argv[1]).tasks(**dict(kv.split("=", 1) for kv in sys.argv[2:]))))
except PolarError as exc:
    print(type(exc).__name__, exc)
"""


def test_datasets_from_the_hub_name_the_extra(plain_env: dict[str, str], tmp_path: Path) -> None:
    done = run(["-c", LOAD, "hf", "path=org/name", "instruction=x"], plain_env)
    assert done.stdout.strip() == f"MissingDependencyError dataset 'hf' needs datasets: {HF_EXTRA}", done.stderr
    done = run(["-c", LOAD, "swegym"], plain_env)
    assert done.stdout.strip() == (
        "MissingDependencyError loading SWE-Gym/SWE-Gym from the hub needs datasets: "
        "pip install 'polar-swebench[hf]'; or give a local copy: polar generate --dataset swegym "
        "-O path=/data/swegym.jsonl (a .jsonl/.json/.parquet file or a folder of them)"
    ), done.stderr
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    done = run(["-c", LOAD, "swegym", f"path={tmp_path / 'rows.parquet'}"], plain_env)
    assert (
        done.stdout.strip() == f"MissingDependencyError reading {tmp_path / 'rows.parquet'} needs pyarrow: {HF_EXTRA}"
    )
