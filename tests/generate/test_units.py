"""Fast checks without a harness: the stratified split, dataset options validated before anything runs, the hf
dataset's mapping, the export's filters on a ledger of synthetic results, its SWE instance columns, and the reward
statistics of generate's tables and the card."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from polar_cli.errors import ConfigError
from polar_cli.export import ExportOptions, export, stratified_test_keys
from polar_cli.export.exporter import task_info
from polar_cli.export.instance import instance_fields, session_fields
from polar_cli.generate.ledger import Ledger, ResultRow
from polar_cli.generate.runner import GenerateOptions
from polar_cli.models import SessionResult, TaskRequest, Trace, Trajectory
from polar_cli.registry import get_dataset
from tests.conftest import shared_fixture

ROOT = Path(__file__).resolve().parents[2]


def test_split_keeps_every_group_of_two_or_more_in_both_and_is_deterministic() -> None:
    rows = [(f"{g}-{i}", g) for g, n in (("a", 2), ("b", 3), ("c", 1), ("d", 40)) for i in range(n)]
    test = stratified_test_keys(rows, 0.1, seed=7)
    for group in ("a", "b", "d"):
        keys = {k for k, g in rows if g == group}
        assert keys & test and keys - test
    assert not {k for k, g in rows if g == "c"} & test
    assert len({k for k, g in rows if g == "d"} & test) == 4
    assert stratified_test_keys(list(reversed(rows)), 0.1, seed=7) == test
    assert stratified_test_keys(rows, 0.1, seed=8) != test


def test_dataset_options_are_validated_before_anything_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "polar_cli", "generate", "--dataset", "demo", "--harness", "pi", "--out",
            str(tmp_path / "out"), "--dataset-option", "taks=[fix-add]"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "unknown field 'taks' (did you mean 'tasks'?)" in done.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="instruction"):
        get_dataset("hf").check_config({"path": "x.jsonl"})
    with pytest.raises(ConfigError, match="Jinja2"):
        get_dataset("hf").check_config({"path": "x.jsonl", "instruction": "{{ broken"})


def test_hf_dataset_maps_a_local_jsonl_file_with_templates(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "file": f"f{i}.txt", "repo": "org/x"}) + "\n" for i in range(3)))
    options = {"path": str(data), "task_id": "hf-{{ id }}", "instruction": "Create {{ file }}.",
               "metadata_fields": {"repo": "repo"},
               "task": {"agent": {"harness": "pi"}, "evaluator": {"strategy": "test_on_output",
                        "config": {"command": "test -f {{ file }}"}}}}  # fmt: skip
    tasks = list(get_dataset("hf").tasks(**options))
    assert [t.task_id for t in tasks] == ["hf-r0", "hf-r1", "hf-r2"]
    assert tasks[1].instruction == "Create f1.txt." and tasks[1].metadata == {"repo": "org/x"}
    assert tasks[2].evaluator.config["command"] == "test -f f2.txt"
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['nope'\]"):
        list(get_dataset("hf").tasks(**{**options, "instruction": "{{ nope }}"}))


def _result(task_id: str, reward: float) -> SessionResult:
    trace = Trace(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 1],
                  response_logprobs=[{"token_id": 3, "logprob": -0.5}, {"token_id": 4, "logprob": -0.25}])  # fmt: skip
    return SessionResult(session_id=f"{task_id}-s", task_id=task_id, status="completed", reward=reward,
                         trajectory=Trajectory(status="completed", traces=[trace]), num_completions=1)  # fmt: skip


def test_export_filters_and_keeps_rejected_rows_on_request(tmp_path: Path) -> None:
    with Ledger(tmp_path / "gen") as ledger:
        for i, reward in enumerate([1.0, 0.0, 1.0, 0.5]):
            task = TaskRequest(task_id=f"t{i}", instruction="x", agent={"harness": "pi"}, metadata={"repo": "r"})
            ledger.remember_task(i, "r", task)
            row = ResultRow(task.task_id, 0, f"t{i}-s", "r", 1, "completed", reward, reward >= 1.0, 2, 4, 1, 1)
            assert ledger.finish(row, _result(task.task_id, reward))
            assert not ledger.finish(row, _result(task.task_id, reward))  # one final result per (task, sample)
    report = export(tmp_path / "gen", tmp_path / "ds", ExportOptions(accepted_only=True, keep_rejected=True))
    assert report.rows["traces"] == {"train": 2, "rejected": 2}
    report = export(tmp_path / "gen", tmp_path / "ds", ExportOptions(min_reward=0.5, overwrite=True))
    assert report.rows["messages"] == {"train": 3}
    with pytest.raises(ConfigError, match="exists"):
        export(tmp_path / "gen", tmp_path / "ds")
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "ds" / "traces" / "train-00000.parquet")
    assert table.column("response_logprobs").to_pylist()[0] == [-0.5, -0.25]
    assert table.column("loss_mask").to_pylist()[0] == [1, 1]


def _rows(dataset: Path) -> dict[str, list[dict[str, object]]]:
    import pyarrow.parquet as pq

    return {config: [r for f in sorted((dataset / config).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
            for config in ("traces", "messages")}  # fmt: skip


def test_export_from_binary_token_columns_writes_the_rows_the_json_path_writes(tmp_path: Path) -> None:
    """Results finished now carry their tokens as arrays (``result_tokens``); a ledger written before that (no such
    rows) exports through the JSON path: both give the very same rows."""
    import sqlite3

    traces = [Trace(prompt_ids=[5, 2**31 - 1, 0], response_ids=[7, 8, 9], loss_mask=[1, 0, 1], finish_reason="stop",
                    response_logprobs=[{"token": "a", "token_id": 7, "logprob": -0.1},
                                       {"token_id": 8, "logprob": 0.0}, {"token_id": 9, "logprob": -1e-300}],
                    prompt_messages=[{"role": "user", "content": "hi"}], metadata={"chain": 0}),
              Trace(prompt_ids=[], response_ids=[1], loss_mask=[1], response_logprobs=None),
              Trace(prompt_ids=[3], response_ids=[], loss_mask=[], response_logprobs=[])]  # fmt: skip
    with Ledger(tmp_path / "gen") as ledger:
        for i in range(3):
            task = TaskRequest(task_id=f"t{i}", instruction="x", agent={"harness": "pi"}, metadata={"repo": "r"})
            ledger.remember_task(i, "r", task)
            result = SessionResult(session_id=f"s{i}", task_id=task.task_id, status="completed", reward=1.0,
                                   trajectory=Trajectory(status="completed", traces=traces[: i + 1]),
                                   num_completions=1)  # fmt: skip
            row = ResultRow(task.task_id, 0, f"s{i}", "r", 1, "completed", 1.0, True, 1, 4, 1, len(traces))
            assert ledger.finish(row, result)
        assert ledger.db.execute("SELECT COUNT(*) FROM result_tokens").fetchone()[0] == 3
    new = export(tmp_path / "gen", tmp_path / "new", ExportOptions())
    with sqlite3.connect(tmp_path / "gen" / "ledger.db") as db:
        db.execute("DROP TABLE result_tokens")  # as a ledger written before the table existed
    old = export(tmp_path / "gen", tmp_path / "old", ExportOptions())
    assert new.rows == old.rows == {"traces": {"train": 6}, "messages": {"train": 3}, "preferences": {"train": 0}}
    assert _rows(tmp_path / "new") == _rows(tmp_path / "old")


def test_export_writes_token_columns_plain_and_zstd_without_statistics(tmp_path: Path) -> None:
    """Token columns: no dictionary (it hashed every token), no statistics; low-cardinality strings keep one."""
    import pyarrow.parquet as pq

    with Ledger(tmp_path / "gen") as ledger:
        task = TaskRequest(task_id="t0", instruction="x", agent={"harness": "pi"}, metadata={"repo": "r"})
        ledger.remember_task(0, "r", task)
        assert ledger.finish(ResultRow("t0", 0, "t0-s", "r", 1, "completed", 1.0, True, 2, 4, 1, 1), _result("t0", 1.0))
    export(tmp_path / "gen", tmp_path / "ds")
    group = pq.ParquetFile(tmp_path / "ds" / "traces" / "train-00000.parquet").metadata.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    for name in ("prompt_ids", "response_ids", "loss_mask", "response_logprobs"):
        column = columns[f"{name}.list.element"]
        assert not column.has_dictionary_page and not column.is_stats_set and column.compression == "ZSTD"
    assert columns["task_id"].has_dictionary_page and columns["reward"].is_stats_set
    assert not columns["metadata"].has_dictionary_page


def test_instance_columns_of_the_papers_payload_come_from_its_instance_and_the_report() -> None:
    """The paper's TaskRequest names its instance by id only: the id is the evaluator's instance's, the repo the
    evaluator's report's; SWE-bench's JSON-text test lists are lists; a task without an instance gets nulls."""
    task = TaskRequest.model_validate(shared_fixture("paper_task_payload.json"))
    fields = instance_fields(task)
    assert fields == {"instance_id": "getmoto__moto-5752", "repo": None, "problem_statement": None,
                      "base_commit": None, "version": None, "FAIL_TO_PASS": None, "PASS_TO_PASS": None}  # fmt: skip
    assert task_info(task).instance_id == "getmoto__moto-5752"
    report = {"instance_id": "getmoto__moto-5752", "repo": "getmoto/moto", "patch_applied": True, "resolved": False,
              "reason": "1 of 2 FAIL_TO_PASS tests do not pass (e.g. t::b: SKIPPED)",
              "tests": {"FAIL_TO_PASS": {"t::a": "PASSED", "t::b": "SKIPPED"}, "PASS_TO_PASS": {"t::c": "XFAIL"}},
              "fail_to_pass_failing": ["t::b"], "pass_to_pass_failing": []}  # fmt: skip
    columns = session_fields(fields, report)
    assert columns["repo"] == "getmoto/moto" and columns["resolved"] is False
    assert columns["grade"] == {
        "patch_applied": True, "reason": report["reason"], "fail_to_pass_passed": 1, "fail_to_pass_total": 2,
        "pass_to_pass_passed": 1, "pass_to_pass_total": 1,
        "FAIL_TO_PASS": [{"test": "t::a", "status": "PASSED"}, {"test": "t::b", "status": "SKIPPED"}],
        "PASS_TO_PASS": [{"test": "t::c", "status": "XFAIL"}]}  # fmt: skip
    instance = {"instance_id": "astropy__astropy-12907", "version": 4.3, "FAIL_TO_PASS": '["t::x"]',
                "PASS_TO_PASS": "[]"}  # fmt: skip
    verified = TaskRequest(task_id="v", instruction="x", agent={"harness": "pi"}, metadata={"repo": "astropy/astropy"},
                           evaluator={"strategy": "swebench_harness", "config": {"instance": instance}})  # fmt: skip
    assert instance_fields(verified) == {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy",
                                         "problem_statement": None, "base_commit": None, "version": "4.3",
                                         "FAIL_TO_PASS": ["t::x"], "PASS_TO_PASS": []}  # fmt: skip
    plain = TaskRequest(task_id="p", instruction="x", agent={"harness": "pi"})
    assert set(session_fields(instance_fields(plain), {"exit_code": 0}).values()) == {None}


def test_export_carries_context_exact_and_the_card_counts_the_inexact_traces(tmp_path: Path) -> None:
    from polar_cli.builders import build_trajectory
    from polar_cli.recompute import load_traces
    from tests.builders.helpers import IM_END, drifting_session, exact_session

    loose = build_trajectory("prefix_merging", drifting_session(), eos_token_id=IM_END, merge="prompt_prefix")
    exact = build_trajectory("prefix_merging", exact_session(), eos_token_id=IM_END)
    with Ledger(tmp_path / "gen") as ledger:
        for i, trajectory in enumerate([loose, exact]):
            task = TaskRequest(task_id=f"t{i}", instruction="x", agent={"harness": "pi"}, metadata={"repo": "r"})
            ledger.remember_task(i, "r", task)
            result = SessionResult(session_id=f"s{i}", task_id=task.task_id, status="completed", reward=1.0,
                                   trajectory=trajectory, num_completions=4)  # fmt: skip
            assert ledger.finish(ResultRow(task.task_id, 0, f"s{i}", "r", 1, "completed", 1.0, True, 8, 90, 4, 1),
                                 result)  # fmt: skip
    report = export(tmp_path / "gen", tmp_path / "ds", ExportOptions())
    assert report.context_inexact == 1
    rows = _rows(tmp_path / "ds")["traces"]
    assert [r["context_exact"] for r in rows] == [False, True]
    assert json.loads(str(rows[0]["metadata"]))["context_exact"] == [True, True, False, False]
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "1 of the 2 traces have `context_exact: false`" in card and "`merge: prompt_prefix`" in card
    assert [t.trace.context_exact for t in load_traces(tmp_path / "ds")] == [False, True]  # polar verify reads it


def test_generate_tables_json_and_the_card_show_reward_statistics(tmp_path: Path) -> None:
    from rich.console import Console

    from polar_cli.commands.generate import finished_sessions, report, summary
    from polar_cli.generate import group_stats

    plan = {"a1": ("a", "pi", [1.0, 0.0]), "a2": ("a", "pi", [1.0, 1.0]), "b1": ("b", "shell", [0.0, 0.0])}
    with Ledger(tmp_path / "gen") as ledger:
        for i, (task_id, (repo, harness, rewards)) in enumerate(plan.items()):
            task = TaskRequest(task_id=task_id, instruction="x", agent={"harness": harness}, metadata={"repo": repo})
            ledger.remember_task(i, repo, task)
            for sample, reward in enumerate(rewards):
                session = f"{task_id}-{sample}"
                row = ResultRow(task_id, sample, session, repo, 1, "completed", reward, reward >= 1.0, 2, 4, 1, 1)
                result = _result(task_id, reward).model_copy(update={"session_id": session, "sample_index": sample})
                assert ledger.finish(row, result)
    rows, failed, harnesses = finished_sessions(tmp_path / "gen")
    assert harnesses == {"a1": "pi", "a2": "pi", "b1": "shell"}
    by_harness = group_stats(rows, by=harnesses)
    console = Console(record=True, width=200)
    report(tmp_path / "gen", "repo", rows, failed, by_harness, console)
    text = console.export_text()
    assert "rewards by repo" in text and "rewards by harness" in text

    def cells(first: str, after: str) -> list[str]:
        line = next(line for line in text[text.index(after):].splitlines() if line.startswith(f"│ {first} "))
        return [c.strip() for c in line.strip("│").split("│")]

    # repo a: rewards 1, 0 | 1, 1 (pass@1 = (1/2 + 1) / 2); repo b: 0, 0; the total: the three tasks
    a = ["2", "4", "4", "0.750", "0.433", "1/2 (50%)", "0.750", "1.000"]
    b = ["1", "2", "2", "0.000", "0.000", "1/1 (100%)", "0.000", "0.000"]
    total = ["3", "6", "6", "0.500", "0.500", "2/3 (67%)", "0.500", "0.667"]
    assert cells("a", "rewards by repo") == ["a", *a] and cells("b", "rewards by repo") == ["b", *b]
    assert cells("total", "rewards by repo") == ["total", *total]
    assert cells("pi", "rewards by harness") == ["pi", *a] and cells("shell", "rewards by harness") == ["shell", *b]
    assert cells("total", "rewards by harness") == ["total", *total]

    document = json.loads(json.dumps(summary(tmp_path / "gen", "repo", rows, failed, by_harness)))
    assert [g["group"] for g in document["groups"]] == ["a", "b", "total"]
    assert document["groups"][0]["rewards"]["pass_at_k"] == {"1": 0.75, "2": 1.0}
    assert document["harnesses"][1]["group"] == "shell" and document["harnesses"][1]["rewards"]["zero_variance"] == 1

    export(tmp_path / "gen", tmp_path / "ds", ExportOptions(stratify_by="repo"))
    card = (tmp_path / "ds" / "README.md").read_text()
    header = "| repo | tasks | sessions | rewarded | reward mean | reward std | zero-variance groups | pass@1 | pass@2 |"  # noqa: E501
    assert header in card
    assert "| a | 2 | 4 | 4 | 0.750 | 0.433 | 1/2 (50%) | 0.750 | 1.000 |" in card
    assert "| **total** | 3 | 6 | 6 | 0.500 | 0.500 | 2/3 (67%) | 0.500 | 0.667 |" in card
    by_harness_card = card[card.index("By harness:"):]  # the same sessions per harness
    assert "| harness | tasks | sessions | rewarded |" in by_harness_card
    assert "| pi | 2 | 4 | 4 | 0.750 | 0.433 | 1/2 (50%) | 0.750 | 1.000 |" in by_harness_card
    assert "| shell | 1 | 2 | 2 | 0.000 | 0.000 | 1/1 (100%) | 0.000 | 0.000 |" in by_harness_card


def test_the_recipe_pins_a_folder_only_once_an_attempt_ran(tmp_path: Path) -> None:
    task = TaskRequest(task_id="t0", instruction="x", agent={"harness": "pi"})
    with Ledger(tmp_path / "gen") as ledger:
        ledger.check_recipe({"dataset": "demo", "builder": "per_request"})
        ledger.remember_task(0, "r", task)
        ledger.check_recipe({"dataset": "demo", "builder": None})  # no attempt yet: replaced, its tasks forgotten
        assert ledger.stored_task("t0") is None
        ledger.remember_task(0, "r", task)
        ledger.start_attempt("t0", 0, 1, "t0.s0.a1")
        ledger.check_recipe({"dataset": "demo", "builder": None})
        with pytest.raises(ConfigError, match=r"generated with builder=None, not 'prefix_merging'"):
            ledger.check_recipe({"dataset": "demo", "builder": "prefix_merging"})
        ledger.more_samples("t0", 3)
        assert ledger.task("t0").num_samples == 3 and ledger.task("t0").instruction == "x"


@pytest.mark.parametrize(("field", "value"), [("samples", 4097), ("timeout_seconds", 1e9)])
def test_generate_options_past_the_servers_limits_are_refused(field: str, value: float) -> None:
    """``--samples`` and ``--timeout`` are bounded as the TaskRequest fields they override (docs/service.md#limits)."""
    with pytest.raises(ValidationError, match=field):
        GenerateOptions.model_validate({"dataset": "demo", field: value})
