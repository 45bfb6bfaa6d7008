"""A real gateway node end to end: the local runtime, the shell harness running a small Python agent that talks to the
proxy over HTTP, the scripted backend, the real builders and evaluators, the HTTP control surface and ``polar run``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import SessionResult, TaskRequest
from tests.gateway.sim import until

# The agent: CALLS chat completions through the session's proxy, then (per env) hangs, crashes or exits.
AGENT = """
import json, os, sys, time, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
for turn in range(int(os.environ.get("CALLS", "2"))):
    body = json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode()
    answer = json.load(urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers)))
    messages += [answer["choices"][0]["message"], {"role": "user", "content": "go on"}]
if os.environ.get("EDIT"):
    with open(os.environ["EDIT"], "a") as fh:
        fh.write("agent was here\\n")
if os.environ.get("PID_FILE"):
    with open(os.environ["PID_FILE"], "w") as fh:
        fh.write(str(os.getpid()))
if os.environ.get("CRASH"):
    sys.exit("agent crashed: " + os.environ["CRASH"])
if os.environ.get("HANG"):
    time.sleep(3600)
print("done")
"""
SCRIPT = [{"content": "first answer"}, {"content": "second answer"}]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@example.invalid", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "polar", "GIT_COMMITTER_EMAIL": "polar@example.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}  # fmt: skip


def task(task_id: str, env: dict[str, str], **extra: Any) -> TaskRequest:
    data: dict[str, Any] = {
        "task_id": task_id,
        "instruction": f"do {task_id}",
        "timeout_seconds": 60,
        "agent": {
            "harness": "shell",
            "env": env,
            "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
        },
        "builder": {"strategy": "per_request"},
        "metadata": {"script": SCRIPT, "group_id": task_id},
    }
    for key, value in extra.items():
        data[key] = value
    return TaskRequest.model_validate(data)


def config(tmp_path: Path, **pipeline: Any) -> GatewayConfig:
    return GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch",
                         pipeline={"init_workers": 2, "run_slots": 4, "postrun_workers": 2, **pipeline})  # fmt: skip


def control(node: GatewayNode) -> dict[str, str]:
    return {"Authorization": f"Bearer {node.config.control_token}"}


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def test_completed_timeout_crash_and_cancel_in_one_gateway(tmp_path: Path) -> None:
    pid_file = tmp_path / "agent.pid"
    not_a_tokenizer = tmp_path / "not-a-tokenizer"
    not_a_tokenizer.mkdir()
    bad_builder = {"strategy": "prefix_merging", "config": {"tokenizer": str(not_a_tokenizer)}}
    tasks = {
        "ok": task("ok", {}),
        # the build fails after the agent ran: the captured calls still count, and the error names the build
        "badbuild": task("badbuild", {}, builder=bad_builder),
        "hang": task("hang", {"HANG": "1"}, timeout_seconds=2),  # stops answering after two model calls
        "crash": task("crash", {"CALLS": "1", "CRASH": "boom"}),
        "cancel": task("cancel", {"CALLS": "1", "HANG": "1", "PID_FILE": str(pid_file)}),
    }

    async def body() -> dict[str, SessionResult]:
        async with GatewayNode(config(tmp_path)) as node:
            jobs = {name: await node.submit(t) for name, t in tasks.items()}
            await until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the agent to start")
            async with httpx.AsyncClient(base_url=node.url, timeout=60, headers=control(node)) as client:
                metrics = (await client.get("/metrics.json")).json()
                assert metrics["stages"]["running"]["capacity"] == 4
                session = jobs["cancel"].session_id
                assert (await client.get(f"/sessions/{session}")).json()["stage"] == "running"
                response = await client.delete(f"/sessions/{session}")
                assert response.status_code == 200
                cancelled = SessionResult.model_validate(response.json())
            assert gone(int(pid_file.read_text()))  # the harness's process died with its runtime
            results = {name: await node.pipeline.wait(job.session_id) for name, job in jobs.items()}
            assert results["cancel"] == cancelled
            return results

    results = asyncio.run(body())
    ok, hang, crash, cancel = (results[k] for k in ("ok", "hang", "crash", "cancel"))
    badbuild = results["badbuild"]
    assert (badbuild.status, badbuild.num_completions, badbuild.trajectory.traces) == ("error", 2, [])
    assert (badbuild.error or "").startswith("build failed: builder 'prefix_merging': cannot load tokenizer")
    assert badbuild.metadata["run_status"] == "completed"
    assert (ok.status, ok.reward, ok.num_completions, len(ok.trajectory.traces)) == ("completed", 1.0, 2, 2)
    assert ok.trajectory.traces[0].metadata["group_id"] == "ok" and ok.trajectory.traces[0].reward == 1.0
    assert (hang.status, hang.num_completions, len(hang.trajectory.traces)) == ("timeout", 2, 2)
    assert hang.reward == 0.0 and "budget of 2 s" in (hang.error or "")
    assert [t.response_messages[0]["content"] for t in hang.trajectory.traces] == ["first answer", "second answer"]
    assert (crash.status, crash.num_completions, crash.reward) == ("error", 1, 0.0)
    assert "agent crashed: boom" in (crash.harness_stderr or "") and "exited with status 1" in (crash.error or "")
    assert (cancel.status, cancel.num_completions, len(cancel.trajectory.traces)) == ("cancelled", 1, 1)
    assert list((tmp_path / "scratch").iterdir()) == []  # no runtime left behind
    stored = sorted(p.name for p in (tmp_path / "data" / "results").iterdir())
    assert stored == sorted(f"{r.session_id}.json" for r in results.values())
    journals = sorted(p.name for p in (tmp_path / "data" / "journal").iterdir())
    assert journals == sorted(f"{r.session_id}.jsonl" for r in results.values())


def test_refreshed_runtime_evaluation_over_http(tmp_path: Path) -> None:
    """POST /sessions a full session whose tests run in a fresh runtime prewarmed during RUNNING."""
    prepare = "mkdir repo && cd repo && git init -q -b main && echo base >notes.txt && git add . && git commit -qm b"
    check = "grep -q 'agent was here' notes.txt && test \"$(git log --format=%s)\" = b"
    refreshed = task(
        "refresh",
        {"CALLS": "1", "EDIT": "repo/notes.txt"},
        runtime={"env": GIT_ENV, "prepare": [{"command": prepare}]},
        evaluator={"strategy": "test_on_output", "refresh_runtime": True, "config": {"command": check, "cwd": "repo"}},
        builder={"strategy": "prefix_merging"},  # end-of-turn ids from the scripted backend's (demo) tokenizer
    )

    async def body() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with (
            GatewayNode(config(tmp_path)) as node,
            httpx.AsyncClient(base_url=node.url, timeout=60, headers=control(node)) as client,
        ):
            bad = await client.post("/sessions", json={"task": {**refreshed.model_dump(), "num_sample": 2}})
            created = await client.post("/sessions", json={"task": refreshed.model_dump(mode="json")})
            assert created.status_code == 201, created.text
            session_id = created.json()["session_id"]
            result = (await client.get(f"/sessions/{session_id}/result", params={"wait": 60})).json()
            unknown = await client.get("/sessions/nope")
            missing = unknown.json() | {"status": unknown.status_code}
            return bad.json() | {"status": bad.status_code}, result, missing

    bad, result, missing = asyncio.run(body())
    assert bad["status"] == 400 and "unknown field 'task.num_sample'" in bad["error"]["message"]
    assert result["status"] == "completed", result
    assert result["reward"] == 1.0 and result["metadata"]["evaluation"]["refreshed"] is True
    assert result["trajectory"]["traces"][0]["metadata"]["builder"] == "prefix_merging"
    assert missing["status"] == 404 and "nope" in missing["error"]["message"]
    assert list((tmp_path / "scratch").iterdir()) == []  # the agent's runtime and the fresh one are both gone


def test_polar_run_prints_a_summary_and_writes_jsonl(tmp_path: Path, monkeypatch: Any) -> None:
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(task("cli", {}, num_samples=2).model_dump(mode="json")))
    out = tmp_path / "out.jsonl"
    monkeypatch.chdir(tmp_path)
    args = ["run", str(task_file), "--out", str(out), "--run-slots", "2"]
    result = CliRunner().invoke(build_app(), args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "completed" in result.output and "trainable" in result.output
    lines = [SessionResult.model_validate_json(line) for line in out.read_text().splitlines()]
    assert [r.sample_index for r in lines] == [0, 1]
    assert all(r.status == "completed" and r.num_completions == 2 for r in lines)
    assert (tmp_path / "polar-data" / "results").is_dir()


def test_polar_run_names_the_bad_field_and_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("task_id: x\ninstruction: y\nagent: {harness: shell}\nnum_sample: 3\n")
    env = {**os.environ, "POLAR_LOAD_PLUGINS": ""}
    run = subprocess.run([sys.executable, "-m", "polar_cli", "run", str(bad)], capture_output=True, text=True, env=env)
    assert run.returncode == 2, run.stderr
    assert f"{bad}: invalid TaskRequest: unknown field 'num_sample' (did you mean 'num_samples'?)" in run.stderr
    assert "Traceback" not in run.stderr
