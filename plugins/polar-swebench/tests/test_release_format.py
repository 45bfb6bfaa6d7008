"""The paper's data release from a ``polar generate`` folder of SWE sessions: ``polar export`` as docs/generate.md
shows it (90/10 split stratified by repo, seed 0), then read back with the real ``datasets``, offline.

The folder is made without running sessions: the tasks are what the ``swegym`` dataset makes of local rows (two
repos, several instances, two samples each, plus one non-SWE task), and each session's result carries the report the
``swebench_harness`` evaluator writes, built by the plugin's own ``grade``; the ledger rows are ``polar generate``'s
own ``summarize``. Some instances have an accepted and a rejected session, some only one kind, one an errored one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from polar_swebench.grading import grade
from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.export import ExportOptions, export
from polar_cli.generate.ledger import Ledger
from polar_cli.generate.runner import summarize
from polar_cli.models import SessionResult, TaskRequest, Trace, Trajectory
from polar_cli.registry import LOAD_ENV, get_dataset, reset_registry
from tests.support.docs import code_blocks

ROOT = Path(__file__).resolve().parents[3]
REPOS = {"acme/widgets": 15, "acme/gadgets": 10}
"""Instances per repo; each runs twice."""
SAMPLES = 2
F2P, P2P = "tests/test_core.py::test_fix", "tests/test_core.py::test_keep"
DOC_TEST = "plugins/polar-swebench/tests/test_release_format.py::test_the_documented_release_command"


def outcome(index: int, sample: int) -> str:
    """Each session's fate: one of each (either order), both accepted, both rejected, or an error beside an
    accepted one."""
    if index % 5 == 4:
        return ("accepted", "error")[sample]
    return [("accepted", "rejected"), ("accepted", "accepted"), ("rejected", "rejected"),
            ("rejected", "accepted")][index % 4][sample]  # fmt: skip


def swe_rows() -> list[dict[str, Any]]:
    return [{"instance_id": f"{repo.replace('/', '__')}-{i}", "repo": repo, "base_commit": f"{i:040x}",
             "version": "1.2", "problem_statement": f"Bug {i} in {repo}", "hints_text": "", "patch": "",
             "test_patch": "", "FAIL_TO_PASS": [F2P], "PASS_TO_PASS": [P2P], "eval_script": "pytest -rA",
             "log_parser": "parse_log_pytest"}
            for repo, n in REPOS.items() for i in range(n)]  # fmt: skip


def session(task: TaskRequest, sample: int, fate: str) -> SessionResult:
    session_id = f"{task.task_id}.s{sample}"
    messages = [{"role": "system", "content": "You are pi."}, {"role": "user", "content": task.instruction}]
    response = [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "pytest"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1 passed"},
        {"role": "assistant", "content": f"{session_id}: {fate}"},
    ]  # fmt: skip
    trace = Trace(prompt_ids=[1, 2, 3], response_ids=[4, 5], loss_mask=[1, 1], prompt_messages=messages,
                  response_messages=response,
                  response_logprobs=[{"token_id": 4, "logprob": -0.5}, {"token_id": 5, "logprob": -0.25}])  # fmt: skip
    metadata: dict[str, Any] = {}
    instance = task.evaluator.config.get("instance")
    if fate != "error" and instance is not None:
        resolved = fate == "accepted"
        report = grade({F2P: "PASSED" if resolved else "FAILED", P2P: "PASSED"}, [F2P], [P2P])
        metadata["evaluation"] = {"instance_id": instance["instance_id"], "repo": instance["repo"],
                                  "patch_applied": True, **report.as_details()}  # fmt: skip
    status = "error" if fate == "error" else "completed"
    reward = None if fate == "error" else float(fate == "accepted")
    return SessionResult(session_id=session_id, task_id=task.task_id, sample_index=sample, status=status,
                         reward=reward, num_completions=2, metadata=metadata,
                         trajectory=Trajectory(status=status, traces=[trace]))  # fmt: skip


@pytest.fixture(scope="module")
def swebench_only() -> Iterator[None]:
    """As conftest's ``_swebench_loaded``, for this module's fixtures: this package's components, no other plugin."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOAD_ENV, "swebench")
        reset_registry()
        yield
    reset_registry()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, swebench_only: None) -> dict[str, Any]:
    """A generate folder (``swegym-pi``, as the docs name it) and what each session is."""
    work = tmp_path_factory.mktemp("release")
    rows = work / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in swe_rows()))
    tasks = list(get_dataset("swegym").tasks(path=str(rows)))
    plain = TaskRequest(task_id="plain-0", instruction="Say hi.", agent={"harness": "pi"})
    fates: dict[tuple[str, int], str] = {}
    with Ledger(work / "swegym-pi") as ledger:
        for position, task in enumerate([*tasks, plain]):
            group = str(task.metadata.get("repo", "-"))
            ledger.remember_task(position, group, task)
            for sample in range(SAMPLES if task is not plain else 1):
                fate = outcome(int(task.task_id.rsplit("-", 1)[1]), sample) if task is not plain else "accepted"
                fates[(task.task_id, sample)] = fate
                result = session(task, sample, fate)
                assert ledger.finish(summarize(task, sample, group, 1 + (fate == "error"), result, 1.0), result)
    return {"work": work, "fates": fates, "repo": {t.task_id: t.metadata["repo"] for t in tasks}}


def documented_command() -> list[str]:
    """The ``polar export`` line of docs/generate.md's block that names this test."""
    block = next(b for b in code_blocks(ROOT / "docs" / "generate.md") if b.tested_by == DOC_TEST)
    line = next(line for line in block.text.splitlines() if line.startswith("polar export "))
    return line.split("#")[0].split()[1:]


def parquet_rows(folder: Path, config: str) -> dict[str, list[dict[str, Any]]]:
    splits: dict[str, list[dict[str, Any]]] = {}
    for file in sorted((folder / config).glob("*.parquet")):
        splits.setdefault(file.name.split("-")[0], []).extend(pq.read_table(file).to_pylist())
    return splits


@pytest.fixture(scope="module")
def released(generated: dict[str, Any], swebench_only: None) -> dict[str, Any]:
    """The documented command, run with the real CLI in the generate folder's parent."""
    args = documented_command()
    cwd = os.getcwd()
    os.chdir(generated["work"])
    try:
        done = CliRunner().invoke(build_app(), args)
    finally:
        os.chdir(cwd)
    assert done.exit_code == 0, done.output
    folder = generated["work"] / args[args.index("--to") + 1]
    return {"folder": folder, "args": args, **{c: parquet_rows(folder, c) for c in ("messages", "preferences")}}


def test_the_documented_release_command(released: dict[str, Any]) -> None:
    args = released["args"]
    assert args[args.index("--test-size") + 1] == "0.1" and args[args.index("--stratify-by") + 1] == "repo"
    assert "--accepted-only" in args and args[args.index("--seed") + 1] == "0"
    assert sorted(released["messages"]) == ["test", "train"] and sorted(released["preferences"]) == ["test", "train"]


def test_messages_carry_the_instance_columns_and_the_grade(generated: dict[str, Any],
                                                          released: dict[str, Any]) -> None:  # fmt: skip
    rows = [r for split in released["messages"].values() for r in split]
    accepted = {k for k, fate in generated["fates"].items() if fate == "accepted"}
    assert {(r["task_id"], r["sample_index"]) for r in rows} == accepted  # --accepted-only
    swe = [r for r in rows if r["task_id"] != "plain-0"]
    for r in swe:
        i = int(r["instance_id"].rsplit("-", 1)[1])
        assert r["repo"] == generated["repo"][r["task_id"]] and r["instance_id"] == r["task_id"]
        assert (r["problem_statement"], r["base_commit"], r["version"]) == (
            f"Bug {i} in {r['repo']}",
            f"{i:040x}",
            "1.2",
        )
        assert (r["FAIL_TO_PASS"], r["PASS_TO_PASS"], r["resolved"]) == ([F2P], [P2P], True)
        assert r["grade"] == {"patch_applied": True, "reason": None, "fail_to_pass_passed": 1, "fail_to_pass_total": 1,
                              "pass_to_pass_passed": 1, "pass_to_pass_total": 1,
                              "FAIL_TO_PASS": [{"test": F2P, "status": "PASSED"}],
                              "PASS_TO_PASS": [{"test": P2P, "status": "PASSED"}]}  # fmt: skip
        assert json.loads(r["metadata"])["repo"] == r["repo"]  # the JSON column stays
    (plain,) = [r for r in rows if r["task_id"] == "plain-0"]  # a non-SWE task: the same columns, null
    assert all(plain[c] is None for c in ("repo", "problem_statement", "base_commit", "version", "FAIL_TO_PASS",
                                          "PASS_TO_PASS", "resolved", "grade"))  # fmt: skip


def test_rejected_rows_carry_why(generated: dict[str, Any]) -> None:
    folder = generated["work"] / "everything"
    export(generated["work"] / "swegym-pi", folder, ExportOptions())
    rows = parquet_rows(folder, "messages")["train"]
    assert len(rows) == len(generated["fates"])
    rejected = [r for r in rows if generated["fates"][(r["task_id"], r["sample_index"])] == "rejected"]
    assert rejected and all(r["resolved"] is False and not r["accepted"] for r in rejected)
    assert all(r["grade"]["fail_to_pass_passed"] == 0 and "FAIL_TO_PASS" in r["grade"]["reason"] for r in rejected)
    errored = [r for r in rows if generated["fates"][(r["task_id"], r["sample_index"])] == "error"]
    assert errored and all(r["resolved"] is None and r["grade"] is None and r["repo"] for r in errored)


def expected_pairs(fates: dict[tuple[str, int], str]) -> dict[str, int]:
    by_task: dict[str, list[str]] = {}
    for (task, _), fate in fates.items():
        by_task.setdefault(task, []).append(fate)
    return {t: min(f.count("accepted"), f.count("rejected")) for t, f in by_task.items() if "rejected" in f and
            "accepted" in f}  # fmt: skip


def test_preferences_pair_an_accepted_and_a_rejected_session_of_one_instance(
    generated: dict[str, Any], released: dict[str, Any]
) -> None:
    fates = generated["fates"]
    pairs = [(split, r) for split, rows in released["preferences"].items() for r in rows]
    assert {r["task_id"]: 1 for _, r in pairs} == expected_pairs(fates) and len(pairs) >= 4
    sessions = {r["session_id"]: (split, r) for split, rows in released["messages"].items() for r in rows}
    for split, r in pairs:
        chosen, rejected = r["chosen_session_id"], r["rejected_session_id"]
        assert chosen.startswith(r["task_id"] + ".") and rejected.startswith(r["task_id"] + ".")
        assert fates[(r["task_id"], int(chosen[-1]))] == "accepted"
        assert fates[(r["task_id"], int(rejected[-1]))] == "rejected"
        assert (r["chosen_reward"], r["rejected_reward"]) == (1.0, 0.0)
        assert sessions[chosen][0] == split  # the pair follows its chosen session's split
        # TRL's conversational preference format: the shared prompt, then each conversation's own turns
        assert [m["role"] for m in r["prompt"]] == ["system", "user"]
        assert r["prompt"][1]["content"] == sessions[chosen][1]["messages"][1]["content"]
        assert [m["role"] for m in r["chosen"]] == [m["role"] for m in r["rejected"]] == ["assistant", "tool",
                                                                                          "assistant"]  # fmt: skip
        assert (r["chosen"][-1]["content"], r["rejected"][-1]["content"]) == (f"{chosen}: accepted",
                                                                            f"{rejected}: rejected")  # fmt: skip
        assert r["chosen"][0]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command":"pytest"}'}
        assert r["repo"] == generated["repo"][r["task_id"]] == json.loads(r["metadata"])["repo"]


def test_split_and_pairs_are_deterministic_with_the_seed(generated: dict[str, Any], released: dict[str, Any]) -> None:
    gen, work = generated["work"] / "swegym-pi", generated["work"]
    options = ExportOptions(accepted_only=True, test_size=0.1, seed=0)
    export(gen, work / "again", options)
    assert parquet_rows(work / "again", "messages") == released["messages"]
    assert parquet_rows(work / "again", "preferences") == released["preferences"]
    export(gen, work / "seed1", options.model_copy(update={"seed": 1}))
    assert parquet_rows(work / "seed1", "messages") != released["messages"]


def test_the_split_is_ninety_ten_within_each_repo(generated: dict[str, Any], released: dict[str, Any]) -> None:
    per_repo: dict[str, dict[str, int]] = {}
    for split, rows in released["messages"].items():
        for r in rows:
            counts = per_repo.setdefault(r["repo"] or "-", {})
            counts[split] = counts.get(split, 0) + 1
    for repo in REPOS:
        n = sum(per_repo[repo].values())
        assert n >= 10 and per_repo[repo]["test"] == min(n - 1, max(1, round(n * 0.1)))
    assert per_repo["-"] == {"train": 1}  # a stratum of one session stays in train
    assert per_repo["acme/widgets"]["test"] == 2  # 10% of a repo with 20+ accepted sessions


def test_the_card_has_the_papers_table_2_per_repo(generated: dict[str, Any], released: dict[str, Any]) -> None:
    card = (released["folder"] / "README.md").read_text()
    assert "config_name: preferences" in card
    lines = card[card.index("## Generation statistics by repo") : card.index("## Exported sessions")].splitlines()
    header = next(line for line in lines if line.startswith("| repo |"))
    assert header.split("|")[2:7] == [" tasks ", " sessions ", " attempts ", " accepted ", " rate "]
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[lines.index(header) + 2:]))
    table = {cells[0].strip("* "): cells[1:] for line in rows
             for cells in [[c.strip() for c in line.strip("|").split("|")]]}  # fmt: skip (the first table only)
    fates = generated["fates"]
    for name, group in [*((r, [k for k in fates if generated["repo"].get(k[0]) == r]) for r in REPOS),
                        ("total", list(fates))]:  # fmt: skip
        accepted = sum(fates[k] == "accepted" for k in group)
        attempts = len(group) + sum(fates[k] == "error" for k in group)
        assert table[name][:5] == [str(len({k[0] for k in group})), str(len(group)), str(attempts), str(accepted),
                                   f"{accepted / len(group):.1%}"], name  # fmt: skip
    assert re.search(r"^\| \*\*total\*\* \|", card, re.M)
    split_table = card[card.index("## Exported sessions by repo and split") :]
    widgets = next(line for line in split_table.splitlines() if line.startswith("| acme/widgets |"))
    messages = released["messages"]
    assert widgets.split("|")[2:4] == [f" {sum(r['repo'] == 'acme/widgets' for r in messages[s])} "
                                       for s in ("train", "test")]  # fmt: skip


def test_load_dataset_reads_every_config_offline(released: dict[str, Any], tmp_path: Path) -> None:
    code = ("import json, sys; from datasets import load_dataset\n"
            "data = {c: load_dataset(sys.argv[1], c) for c in ('traces', 'messages', 'preferences')}\n"
            "out = {c: {s: d.num_rows for s, d in splits.items()} for c, splits in data.items()}\n"
            "m, p = data['messages']['train'], data['preferences']['train']\n"
            "out['columns'] = m.column_names; out['pair'] = [p[0]['prompt'][1]['role'], p[0]['chosen'][0]['role']]\n"
            "out['grade'] = m.features['grade']['FAIL_TO_PASS'].feature['status'].dtype\n"
            "print(json.dumps(out))")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf-home"), "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(released["folder"])], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for config in ("messages", "preferences"):
        assert out[config] == {s: len(rows) for s, rows in released[config].items()}
    assert sum(out["traces"].values()) == sum(out["messages"].values())
    assert {"instance_id", "repo", "problem_statement", "base_commit", "version", "FAIL_TO_PASS", "PASS_TO_PASS",
            "resolved", "grade", "metadata", "messages"} <= set(out["columns"])  # fmt: skip
    assert out["pair"] == ["user", "assistant"] and out["grade"] == "string"


def test_an_instance_named_by_id_only_takes_its_columns_from_the_report() -> None:
    """The paper's payload names its instance by id: the graded report gives repo, base_commit, version and the
    test lists (the problem statement stays null: the report does not carry it)."""
    from polar_cli.export.instance import instance_fields, session_fields

    task = TaskRequest.model_validate({
        "task_id": "t", "instruction": "fix it", "agent": {"harness": "shell", "model_name": "m"},
        "runtime": {"backend": "local"},
        "evaluator": {"strategy": "swebench_harness", "config": {"instance": {"instance_id": "o__r-1"}}},
    })  # fmt: skip
    report = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "version": "1.0", "resolved": True,
              "patch_applied": True, "tests": {"FAIL_TO_PASS": {"t::a": "PASSED"}, "PASS_TO_PASS": {}}}  # fmt: skip
    columns = session_fields(instance_fields(task), report)
    assert (columns["repo"], columns["base_commit"], columns["version"]) == ("o/r", "abc", "1.0")
    assert (columns["FAIL_TO_PASS"], columns["PASS_TO_PASS"], columns["problem_statement"]) == (["t::a"], [], None)
    assert columns["resolved"] is True and columns["grade"]["fail_to_pass_passed"] == 1
