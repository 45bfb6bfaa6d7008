"""The paper's TaskRequest (appendix A.3, ``../shared/fixtures/paper_task_payload.json``) as written: accepted by a real
``polar serve``, and run to a graded result with its instance (given only by ``instance_id``) looked up in the rows
the operator configured (``POLAR_SWEBENCH_DATASET``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from polar_swebench import lookup
from polar_swebench.lookup import DATASET_ENV, SPLIT_ENV, InstanceSource, lookup_instance

from polar_cli.api import ConfigError, EvaluationContext, EvaluationError, TaskRequest, Trajectory
from polar_cli.harnesses.testing import polar_run_file
from polar_cli.registry import get_evaluator, get_harness, reset_registry
from tests.conftest import shared_fixture
from tests.server.procs import Serve, client

PAPER_ID = "getmoto__moto-5752"
PAYLOAD = "paper_task_payload.json"


def payload() -> dict[str, Any]:
    return dict(shared_fixture(PAYLOAD))


def config_of(task: dict[str, Any]) -> dict[str, Any]:
    return dict(task["evaluator"]["config"])


def test_the_paper_payload_is_accepted_by_polar_serve_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server checks a task when it is submitted (HTTP 400 naming the field otherwise); ``--role server`` runs
    nothing, so the paper's image (not here) is never pulled. A ``repo_dir`` that is not a runtime path is refused."""
    monkeypatch.setenv("POLAR_LOAD_PLUGINS", "swebench,codex")  # the payload's evaluator and harness
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0")

    async def body() -> dict[str, Any]:
        info = await server.ready()
        async with client(info) as http:
            accepted = await http.post("/rollout/task/submit", json=payload())
            assert accepted.status_code == 200, accepted.text
            assert accepted.json() == {"task_id": "polar-swegym-0001-0", "status": "pending", "created": True}
            status = (await http.get("/rollout/task/polar-swegym-0001-0")).json()
            bad = payload()
            bad["task_id"] = "climbs-out"
            bad["evaluator"]["config"]["repo_dir"] = "/testbed/../etc"
            refused = await http.post("/rollout/task/submit", json=bad)
            assert refused.status_code == 400, refused.text
            assert "repo_dir" in refused.text and "'..'" in refused.text
            return dict(status)

    try:
        status = asyncio.run(body())
    finally:
        server.stop()
    assert status["task_id"] == "polar-swegym-0001-0" and status["num_samples"] == 8, status


@pytest.mark.parametrize(
    ("repo_dir", "problem"),
    [("testbed", "must be an absolute path"), ("/testbed/../..", "'..'"), ("/test\nbed", "control characters")],
)
def test_repo_dir_must_be_an_absolute_runtime_path_without_dotdot(repo_dir: str, problem: str) -> None:
    config = {**config_of(payload()), "repo_dir": repo_dir}
    with pytest.raises(ConfigError, match="repo_dir") as info:
        get_evaluator("swebench_harness").check_config(config)
    assert problem in str(info.value)


def test_repo_dir_is_normalised() -> None:
    config = {**config_of(payload()), "repo_dir": "/testbed//./src/"}
    assert get_evaluator("swebench_harness").parse_config(config).repo_dir == "/testbed/src"


def test_a_task_cannot_name_a_host_folder_for_the_eval_logs() -> None:
    """The full eval logs go where the operator says (POLAR_SWEBENCH_LOG_DIR), never to a folder a task names."""
    config = {**config_of(payload()), "log_dir": "/etc"}
    with pytest.raises(ConfigError, match="log_dir"):
        get_evaluator("swebench_harness").check_config(config)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def evaluate(config: dict[str, Any], task: TaskRequest | None = None) -> Any:
    """``swebench_harness`` on a session whose runtimes are never used (the failures tested here come first)."""
    context = EvaluationContext(session_id="s1", status="completed", completions=[],
                                trajectory=Trajectory(status="completed"), config=config, task=task,
                                runtime=object(), fresh_runtime=object())  # type: ignore[arg-type]  # fmt: skip
    return asyncio.run(get_evaluator("swebench_harness").evaluate(context))


def test_under_the_local_runtime_repo_dir_must_be_in_the_session() -> None:
    """The local runtime's commands are host processes: there /testbed would be a host directory."""
    data = payload()
    data["runtime"] = {"backend": "local"}
    with pytest.raises(EvaluationError, match="repo_dir '/testbed' is a host path under the local runtime"):
        evaluate(config_of(data), TaskRequest.model_validate(data))


def test_an_unknown_instance_id_is_an_evaluation_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swe_fixture: Any
) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", [swe_fixture.instance])
    monkeypatch.setenv(DATASET_ENV, str(rows))
    with pytest.raises(EvaluationError) as info:
        evaluate(config_of(payload()))
    message = str(info.value)
    assert f"instance '{PAPER_ID}' is not in {rows}" in message and "(1 instances)" in message, message
    monkeypatch.delenv(DATASET_ENV)
    with pytest.raises(EvaluationError, match=f"'{PAPER_ID}' is given only by its instance_id and no SWE dataset"):
        evaluate(config_of(payload()))
    monkeypatch.setenv(DATASET_ENV, str(tmp_path / "missing.jsonl"))
    with pytest.raises(EvaluationError, match=f"'{PAPER_ID}': cannot read .*missing.jsonl.*does not exist"):
        evaluate(config_of(payload()))


@pytest.mark.harness
def test_a_session_whose_instance_is_not_found_ends_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swe_fixture: Any, need_cli: Callable[[str], None]
) -> None:
    """Through ``polar run`` (the real pi CLI, local runtime, the scripted model answers at once): the session ends
    ``error`` with the evaluator's message; nothing crashes."""
    need_cli("pi")
    monkeypatch.setenv(DATASET_ENV, str(write_rows(tmp_path / "rows.jsonl", [swe_fixture.instance])))
    task = {"task_id": "lookup-miss", "instruction": "Say done.", "runtime": {"backend": "local"},
            "agent": {"harness": "pi", "model_name": "polar-test"},
            "evaluator": {**payload()["evaluator"], "config": {"instance": {"instance_id": PAPER_ID}}},
            "metadata": {"script": [{"role": "assistant", "content": "done"}]}}  # fmt: skip
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(task))
    (report,) = polar_run_file(task_file, tmp_path)
    assert report.result is not None, report.describe()
    assert (report.result.status, report.result.reward) == ("error", None), report.describe()
    assert report.result.error == (f"evaluation failed: swebench_harness: instance '{PAPER_ID}' is not in "
                                   f"{tmp_path / 'rows.jsonl'} ({DATASET_ENV}) (1 instances)")  # fmt: skip


def test_rows_are_found_in_files_folders_and_skyrl_rows(tmp_path: Path, swe_fixture: Any) -> None:
    row = {**swe_fixture.instance, "instance_id": PAPER_ID}
    write_rows(tmp_path / "flat.jsonl", [swe_fixture.instance, row])
    folder = tmp_path / "skyrl"
    folder.mkdir()
    write_rows(folder / "train.jsonl", [{"instance": row, "data_source": "swe-gym"}])
    write_rows(folder / "validation.jsonl", [{"instance": json.dumps(swe_fixture.instance)}])
    for source in (InstanceSource(str(tmp_path / "flat.jsonl")), InstanceSource(str(folder), "train")):
        assert source.local
        found = lookup_instance(PAPER_ID, source)
        assert (found.instance_id, found.fail_to_pass) == (PAPER_ID, ["tests/test_calc.py::test_add"])
    assert lookup_instance(swe_fixture.instance["instance_id"], InstanceSource(str(folder))).repo


def test_a_hub_dataset_is_read_with_datasets(monkeypatch: pytest.MonkeyPatch, swe_fixture: Any) -> None:
    """No HuggingFace Hub is reachable here: ``datasets.load_dataset`` is replaced (the hub only, nothing of Polar's),
    and offline mode skips the reachability probe."""
    import datasets  # polar-rl's dev extra
    asked: list[tuple[str, str]] = []

    def load_dataset(hub_id: str, split: str) -> list[dict[str, Any]]:
        asked.append((hub_id, split))
        return [{**swe_fixture.instance, "instance_id": PAPER_ID}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(DATASET_ENV, "SWE-Gym/SWE-Gym")
    monkeypatch.delenv(SPLIT_ENV, raising=False)
    lookup._index.cache_clear()
    source = InstanceSource.from_env()
    assert source is not None and not source.local
    assert lookup_instance(PAPER_ID).repo == swe_fixture.instance["repo"]
    assert lookup_instance(PAPER_ID).instance_id == PAPER_ID
    assert asked == [("SWE-Gym/SWE-Gym", "train")]  # read once, then kept


# ---- the payload run to a graded result (Docker, the real codex CLI, the scripted backend as the model) ----

WORKSPACE = "/polar/session/workspace"
# the payload's prepare action is a description, not a command: what it says, for the fixture repository at /testbed
PREPARE = f"mkdir -p {WORKSPACE} && cp -a /testbed/. {WORKSPACE}/"
FIX = "sed -i '0,/return a - b/s//return a + b/' calc/__init__.py && git diff --stat"


def runnable(task: dict[str, Any], image: str) -> dict[str, Any]:
    """The payload with only what cannot run here swapped (each named in the module's report), and the scripted
    model's turns added to its metadata."""
    task = json.loads(json.dumps(task))
    task["runtime"]["image"] = image  # xingyaoww/... cannot be pulled here: the fixture SWE image, repo at /testbed
    task["runtime"]["prepare"] = [{"type": "exec", "command": PREPARE}]
    task["num_samples"] = 1  # eight identical scripted sessions would only cost CI time
    task["metadata"]["script"] = get_harness("codex").doctor_script(FIX)  # the model: the scripted backend
    return task


@pytest.mark.docker
@pytest.mark.harness
def test_the_paper_payload_runs_to_a_graded_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swe_image: str, swe_fixture: Any, need_cli: Callable[[str], None],
    resolved_by_polar_run: Callable[[dict[str, Any], Path], Any],
) -> None:
    monkeypatch.setenv("POLAR_LOAD_PLUGINS", "swebench,codex")  # the payload's harness too
    reset_registry()
    need_cli("codex")
    rows = write_rows(tmp_path / "swe-rows.jsonl", [{**swe_fixture.instance, "instance_id": PAPER_ID}])
    monkeypatch.setenv(DATASET_ENV, str(rows))  # the operator's rows: the gateway (here polar run) reads them
    task = runnable(payload(), swe_image)
    assert task["evaluator"] == payload()["evaluator"] and task["agent"] == payload()["agent"]
    result = resolved_by_polar_run(task, tmp_path)
    evaluation = result.metadata["evaluation"]
    assert (evaluation["instance_id"], evaluation["script_source"], evaluation["apply_method"]) == (
        PAPER_ID, "instance", "git apply")  # fmt: skip
    assert {t.metadata.get("policy_version") for t in result.trajectory.traces} == {3}  # the payload's metadata
