"""``polar submit`` and ``polar status`` against a real ``polar serve``."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.client import PolarClient
from polar_cli.errors import SessionError
from polar_cli.models import ServiceStatus, TaskStatus
from tests.client.conftest import Served
from tests.gateway.test_node import task
from tests.server.procs import waiting_task
from tests.support.planned import planned

WIDE = {"COLUMNS": "200"}


def write_task(path: Path, task_id: str, env: dict[str, str]) -> Path:
    path.write_text(json.dumps(task(task_id, env).model_dump(mode="json")))
    return path


def test_submit_wait_summarizes_sessions_and_status_shows_the_service(served: Served, tmp_path: Path) -> None:
    task_file = write_task(tmp_path / "task.json", "cli-ok", {})
    server = ["--server", served.url, "--token", served.token]
    result = CliRunner().invoke(build_app(), ["submit", str(task_file), *server, "--samples", "2", "--wait"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "cli-ok"  # the task id first, for scripts
    assert "trainable tokens" in result.stdout and result.stdout.count("completed") >= 2
    assert "task cli-ok: completed, 2 completed, 0 failed of 2" in result.stderr

    overview = CliRunner().invoke(build_app(), ["status", *server], env=WIDE)
    assert overview.exit_code == 0, overview.output
    assert "tasks" in overview.stdout and "nodes" in overview.stdout and "healthy" in overview.stdout
    assert "pending sessions: 0" in overview.stdout
    as_json = CliRunner().invoke(build_app(), ["status", *server, "--json"], env=WIDE)
    service = ServiceStatus.model_validate_json(as_json.stdout)
    assert service.tasks["completed"] >= 1 and len(service.nodes) >= 1

    one = CliRunner().invoke(build_app(), ["status", "cli-ok", *server], env=WIDE)
    assert one.exit_code == 0, one.output
    assert "task cli-ok: completed" in one.stdout and one.stdout.count("finished") == 2
    one_json = CliRunner().invoke(build_app(), ["status", "cli-ok", *server, "--json"], env=WIDE)
    assert TaskStatus.model_validate_json(one_json.stdout).completed == 2


def table_row(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if "│" in line and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


def test_reward_statistics_in_submit_wait_status_and_its_json(served: Served, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.json"  # rewards 1, 0, 1, 0: two accepted of four
    mixed.write_text(planned("rw-mixed", ["pass", "fail", "pass", "fail"], tmp_path).model_dump_json())
    server = ["--server", served.url, "--token", served.token]
    waited = CliRunner().invoke(build_app(), ["submit", str(mixed), *server, "--wait"], env=WIDE)
    assert waited.exit_code == 0, waited.output
    assert "rewards of task rw-mixed" in waited.stdout
    figures = ["4", "4", "0.500", "0.500", "0/1 (0%)", "0.500", "0.833", "1.000", "1.000"]  # pass@2 = 1 - 1/6
    assert table_row(waited.stdout, "rw-mixed") == ["rw-mixed", "shell", *figures]

    one = CliRunner().invoke(build_app(), ["status", "rw-mixed", *server], env=WIDE)
    assert one.exit_code == 0, one.output
    assert "pass@4" in one.stdout and table_row(one.stdout, "rw-mixed") == ["rw-mixed", "shell", *figures]
    as_json = CliRunner().invoke(build_app(), ["status", "rw-mixed", *server, "--json"], env=WIDE)
    status = TaskStatus.model_validate_json(as_json.stdout)
    assert status.harness == "shell" and status.rewards is not None
    rewards = status.rewards
    assert (rewards.sessions, rewards.rewarded, rewards.accepted, rewards.mean, rewards.std) == (4, 4, 2, 0.5, 0.5)
    assert (rewards.groups, rewards.zero_variance, rewards.zero_variance_share) == (1, 0, 0.0)
    assert rewards.pass_at_k == pytest.approx({1: 0.5, 2: 5 / 6, 3: 1.0, 4: 1.0})
    assert json.loads(as_json.stdout)["rewards"]["pass_at_k"]["2"] == pytest.approx(5 / 6)

    with PolarClient(served.url, served.token) as client:  # all equal: a zero-variance group
        client.submit(planned("rw-equal", ["pass", "pass"], tmp_path))
        assert client.wait("rw-equal", timeout=60).state == "completed"
    overview = CliRunner().invoke(build_app(), ["status", *server, "--json"], env=WIDE)
    service = ServiceStatus.model_validate_json(overview.stdout)
    assert service.rewards is not None
    recent = {t.task_id: t for t in service.rewards.tasks}
    assert recent["rw-mixed"].stats == rewards and recent["rw-equal"].harness == "shell"
    assert recent["rw-equal"].stats.zero_variance == 1 and recent["rw-equal"].stats.pass_at_k == {1: 1.0, 2: 1.0}
    shell = next(h for h in service.rewards.harnesses if h.harness == "shell")
    assert shell.tasks == sum(t.harness == "shell" for t in service.rewards.tasks) >= 2
    watch = CliRunner().invoke(build_app(), ["status", *server, "--watch", "--count", "1"], env=WIDE)
    assert watch.exit_code == 0, watch.output
    assert "rewards by harness" in watch.stdout and table_row(watch.stdout, "shell")[:2] == ["shell", str(shell.tasks)]
    assert table_row(watch.stdout, "rw-equal")[1:] == ["shell", "2", "2", "1.000", "0.000", "1/1 (100%)", "1.000",
                                                      "1.000", "-", "-"]  # fmt: skip


def test_submit_wait_exits_1_when_a_session_errored(served: Served, tmp_path: Path) -> None:
    task_file = write_task(tmp_path / "crash.json", "cli-crash", {"CALLS": "1", "CRASH": "boom"})
    env = {**os.environ, "POLAR_LOAD_PLUGINS": "", "POLAR_SERVER": served.url, "POLAR_TOKEN": served.token, **WIDE}
    run = subprocess.run([sys.executable, "-m", "polar_cli", "submit", str(task_file), "--wait"],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert run.stdout.splitlines()[0] == "cli-crash" and "error" in run.stdout
    assert "exited with status 1" in run.stdout and "Traceback" not in run.stderr


def test_submit_wait_exits_1_when_the_task_failed_without_an_errored_session(served: Served, tmp_path: Path) -> None:
    task_file = write_task(tmp_path / "silent.json", "cli-silent", {"CALLS": "0"})  # its agent never calls the model
    run = polar("submit", str(task_file), "--wait", served=served)
    assert "task cli-silent: failed, 0 completed, 1 failed of 1" in run.stderr, run.stderr
    assert run.returncode == 1 and "no_model_call" in run.stdout


def test_session_tables_show_the_error_whole_in_a_pipe(served: Served, tmp_path: Path) -> None:
    cause = "the sandbox could not reach Polar's proxy at http://127.0.0.1:1/s/abc/v1 after 3 tries " + "x" * 120
    task_file = write_task(tmp_path / "crash.json", "cli-long-error", {"CALLS": "1", "CRASH": cause})
    waited = polar("submit", str(task_file), "--wait", served=served)
    assert waited.returncode == 1 and cause in waited.stdout, waited.stdout
    shown = polar("status", "cli-long-error", served=served)
    assert shown.returncode == 0 and cause in shown.stdout and "..." not in shown.stdout, shown.stdout


def test_exit_codes_follow_the_convention(served: Served, tmp_path: Path) -> None:
    """docs/cli.md: 2 for what the user gave (a 4xx), 3 for what cannot be reached or refuses the token."""
    unreachable = polar("status", env={"POLAR_SERVER": "http://127.0.0.1:1"}, served=served)
    assert unreachable.returncode == 3 and "cannot reach the Polar server" in unreachable.stderr
    missing = polar("status", "cli-nope", env={"POLAR_TOKEN": ""}, served=served)
    wrong = polar("status", "cli-nope", env={"POLAR_TOKEN": "not-the-token"}, served=served)
    assert missing.returncode == wrong.returncode == 3
    assert "needs its server token" in missing.stderr and "HTTP 401" in missing.stderr, missing.stderr
    assert "wrong server token" in wrong.stderr and "HTTP 401" in wrong.stderr, wrong.stderr
    unknown = polar("status", "cli-nope", served=served)
    assert unknown.returncode == 2 and "unknown task 'cli-nope'" in unknown.stderr


def test_cli_errors_are_one_line(served: Served, tmp_path: Path) -> None:
    env = {**os.environ, "POLAR_LOAD_PLUGINS": ""}
    unknown = subprocess.run([sys.executable, "-m", "polar_cli", "status", "nope", "--server", served.url,
                              "--token", served.token], capture_output=True, text=True, env=env)  # fmt: skip
    assert unknown.returncode == 2 and "HTTP 404" in unknown.stderr and "Traceback" not in unknown.stderr
    wrong = subprocess.run([sys.executable, "-m", "polar_cli", "status", "--server", served.url, "--token", "wrong"],
                           capture_output=True, text=True, env=env)  # fmt: skip
    assert wrong.returncode == 3 and "HTTP 401" in wrong.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("task_id: x\ninstruction: y\nagent: {harness: shell}\nnum_sample: 3\n")
    invalid = subprocess.run([sys.executable, "-m", "polar_cli", "submit", str(bad), "--server", served.url],
                             capture_output=True, text=True, env=env)  # fmt: skip
    assert invalid.returncode == 2 and "unknown field 'num_sample'" in invalid.stderr


def polar(*args: str, served: Served, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``polar ARGS`` in a subprocess (stdout a pipe), the server and token from the environment."""
    full = {**os.environ, "POLAR_LOAD_PLUGINS": "", "POLAR_SERVER": served.url, "POLAR_TOKEN": served.token,
            **(env or {})}  # fmt: skip
    full.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "polar_cli", *args], capture_output=True, text=True, env=full,
                          timeout=300)  # fmt: skip


def without_id(path: Path, data: dict[str, object]) -> Path:
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "task_id"}))
    return path


def test_submit_task_ids_fresh_named_existing_and_taken(served: Served, tmp_path: Path) -> None:
    task_file = without_id(tmp_path / "task.json", task("unused", {}).model_dump(mode="json"))
    first, second = polar("submit", str(task_file), served=served), polar("submit", str(task_file), served=served)
    ids = [first.stdout.strip(), second.stdout.strip()]
    assert first.returncode == second.returncode == 0 and ids[0] != ids[1], (first.stderr, second.stderr)
    assert all(i.startswith("task-") for i in ids)
    named = polar("submit", str(task_file), "--task-id", "cli-named", "--wait", served=served)
    assert named.returncode == 0 and named.stdout.splitlines()[0] == "cli-named", named.stderr
    assert f"submitted cli-named (pending) to {served.url}" in named.stderr
    again = polar("submit", str(task_file), "--task-id", "cli-named", served=served)
    assert again.returncode == 0 and again.stdout == "cli-named\n"
    existed = f"task cli-named already existed on {served.url} with this body: completed, 1 completed, 0 failed of 1"
    assert again.stderr.strip() == f"{existed}; nothing new runs (--task-id NEW runs it again)"
    taken = polar("submit", str(task_file), "--task-id", "cli-named", "--samples", "2", served=served)
    assert taken.returncode == 2 and taken.stdout == "" and len(taken.stderr.strip().splitlines()) == 1
    assert taken.stderr.startswith("Error: task 'cli-named' exists with a different body: submit this one under")
    assert "polar submit --task-id ID" in taken.stderr and "HTTP 409" in taken.stderr


def test_submit_json_is_one_document_on_stdout(served: Served, tmp_path: Path) -> None:
    task_file = write_task(tmp_path / "task.json", "cli-json", {})
    submitted = polar("submit", str(task_file), "--json", served=served)
    assert submitted.returncode == 0, submitted.stderr
    answer = json.loads(submitted.stdout)
    assert answer["task_id"] == "cli-json" and answer["created"] is True and "submitted cli-json" in submitted.stderr
    waited = polar("submit", str(task_file), "--samples", "2", "--task-id", "cli-json-2", "--wait", "--json",
                   served=served)  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    final = TaskStatus.model_validate(json.loads(waited.stdout))  # the whole of stdout: one document
    assert (final.task_id, final.state, final.completed, len(final.results)) == ("cli-json-2", "completed", 2, 2)
    assert "task cli-json-2: completed, 2 completed, 0 failed of 2" in waited.stderr
    assert "trainable tokens" in waited.stderr  # the summary table is for people: stderr


def test_status_tables_are_not_cut_in_a_pipe(served: Served, tmp_path: Path) -> None:
    task_file = write_task(tmp_path / "task.json", "cli-a-task-id-long-enough-to-need-more-than-eighty-columns", {})
    assert polar("submit", str(task_file), "--wait", served=served).returncode == 0
    shown = polar("status", "cli-a-task-id-long-enough-to-need-more-than-eighty-columns", served=served)
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout and max(len(line) for line in shown.stdout.splitlines()) > 100
    assert "cli-a-task-id-long-enough-to-need-more-than-eighty-columns-0-" in shown.stdout  # the session id, whole


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_submit_wait_stops_on_a_signal_and_the_task_runs_on(served: Served, tmp_path: Path, stop: int) -> None:
    task_id = f"cli-stop-{signal.Signals(stop).name}"
    marker = tmp_path / "go"
    task_file = without_id(tmp_path / "task.json", waiting_task("unused", 1, marker))
    env = {**os.environ, "POLAR_LOAD_PLUGINS": "", "POLAR_SERVER": served.url, "POLAR_TOKEN": served.token}
    argv = [sys.executable, "-m", "polar_cli", "submit", str(task_file), "--task-id", task_id, "--wait"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        with PolarClient(served.url, served.token) as client:
            until_sync(lambda: _running(client, task_id))
            time.sleep(0.5)  # the command is following it
            sent = time.monotonic()
            proc.send_signal(stop)
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - sent
            assert client.status(task_id).state == "running"  # stopping the command stopped nothing on the server
    finally:
        marker.touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + stop and took < 15, (proc.returncode, took, err)  # the task never ends by itself
    assert out == f"{task_id}\n" and "Traceback" not in err
    note = err.strip().splitlines()[-1]
    follow = f"polar submit {task_file} --task-id {task_id} --wait"
    assert note == (f"stopped following task {task_id}: it keeps running on the server; `polar status {task_id}` "
                    f"shows it, `{follow}` follows it again")  # fmt: skip
    again = polar(*shlex.split(follow)[1:], served=served)  # what the note says, as written
    assert again.returncode == 0, again.stderr
    assert f"task {task_id} already existed" in again.stderr and f"task {task_id}: completed" in again.stderr


def _running(client: PolarClient, task_id: str) -> bool:
    try:
        return client.status(task_id).state == "running"
    except SessionError:
        return False


def until_sync(check: Callable[[], bool], within: float = 60.0) -> None:
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)
