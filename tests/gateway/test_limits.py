"""``agent.limits`` ending real sessions: a gateway node, the local runtime and the shell harness running a small
Python agent that keeps calling the proxy (and, refused, keeps retrying, as a stubborn harness would), the scripted
backend. Each session that hits a limit ends ``limit`` with the limit named, promptly (its harness is stopped, long
before the agent's deadline), and keeps the traces of every call it made before."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.gateway.node import GatewayNode
from polar_cli.models import SessionResult, TaskRequest
from polar_cli.proxy.journal import read_journal
from tests.gateway.test_node import config

# Calls chat completions until it has made CALLS calls (max_tokens from MAX_TOKENS, if set); a refused call is retried
AGENT = """
import json, os, time, urllib.error, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
done = 0
while done < int(os.environ.get("CALLS", "1000")):
    body = {"model": os.environ["POLAR_MODEL"], "messages": messages}
    if os.environ.get("MAX_TOKENS"):
        body["max_tokens"] = int(os.environ["MAX_TOKENS"])
    try:
        answer = json.load(urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode(),
                                                                         headers=headers)))
    except urllib.error.HTTPError as exc:
        print("refused:", exc.read().decode(), flush=True)
        time.sleep(0.05)
        continue
    messages += [answer["choices"][0]["message"], {"role": "user", "content": "go on"}]
    done += 1
print("done")
"""

AGENT_SECONDS = 60


def limited_task(task_id: str, limits: dict[str, int], script: list[str], **env: str) -> TaskRequest:
    return TaskRequest.model_validate({
        "task_id": task_id,
        "instruction": f"do {task_id}",
        "timeout_seconds": AGENT_SECONDS,
        "agent": {
            "harness": "shell",
            "env": env,
            "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
            "limits": limits,
        },
        "builder": {"strategy": "per_request"},
        "metadata": {"script": [{"content": text} for text in script]},
    })  # fmt: skip


def test_limits_and_loop_detection_end_real_sessions_with_status_limit_keeping_their_traces(tmp_path: Path) -> None:
    distinct = [f"answer {i}" for i in range(20)]
    tasks = {
        "calls": limited_task("calls", {"max_model_calls": 3}, distinct),
        "tokens": limited_task("tokens", {"max_sampled_tokens": 1}, distinct),
        "loop": limited_task("loop", {"repeat_limit": 3}, ["a", "b", "same", "same", "same", "c", "d"]),
        "clamp": limited_task("clamp", {"max_call_tokens": 7}, distinct, CALLS="2", MAX_TOKENS="100"),
        "within": limited_task("within", {"max_model_calls": 2, "repeat_limit": 2}, distinct, CALLS="2"),
    }

    async def body() -> dict[str, SessionResult]:
        async with GatewayNode(config(tmp_path)) as node:
            jobs = {name: await node.submit(task) for name, task in tasks.items()}
            return {name: await node.pipeline.wait(job.session_id) for name, job in jobs.items()}

    results = asyncio.run(body())
    for name in ("calls", "tokens", "loop"):
        result = results[name]
        assert result.status == "limit", (name, result.status, result.error)
        assert result.stage_seconds["running"] < AGENT_SECONDS / 2, name  # stopped, not timed out
        assert result.trajectory.status == "limit"
        assert result.metadata["run_status"] == "limit" and result.metadata["run"]["limit"]["name"] in result.error
        assert len(result.trajectory.traces) == result.num_completions  # per_request: one trace per captured call
        assert all(trace.trainable_tokens for trace in result.trajectory.traces)
    assert results["calls"].error == "limit max_model_calls=3 reached after 3 calls"
    assert results["calls"].num_completions == 3
    assert results["tokens"].error is not None and results["tokens"].error.startswith("limit max_sampled_tokens=1 ")
    assert results["tokens"].num_completions == 1
    assert results["loop"].error is not None and results["loop"].error.startswith("limit repeat_limit=3 reached")
    assert results["loop"].num_completions == 5  # a, b and the three "same": the third trips it
    assert results["loop"].reward == 0.0  # evaluated like a timeout: session_completion gives 0

    assert results["clamp"].status == "completed" and results["clamp"].num_completions == 2
    journal = read_journal(tmp_path / "data" / "journal" / f"{results['clamp'].session_id}.jsonl")
    assert [c.request["max_tokens"] for c in journal] == [100, 100]  # what the harness asked
    assert [c.request_params["max_tokens"] for c in journal] == [7, 7]  # what the backend received
    assert results["within"].status == "completed", results["within"].error  # reaching a cap is no hit
    assert results["within"].num_completions == 2


def test_polar_run_reports_a_limit_session_and_exits_0(tmp_path: Path, monkeypatch: Any) -> None:
    task_file = tmp_path / "task.json"
    limited = limited_task("cli", {"max_model_calls": 2}, [f"answer {i}" for i in range(5)])
    task_file.write_text(limited.model_dump_json())
    out = tmp_path / "out.jsonl"
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(build_app(), ["run", str(task_file), "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output  # a session stopped by its limits is no failure of polar run
    assert "limit max_model_calls=2 reached after 2 calls" in result.output
    (line,) = out.read_text().splitlines()
    session = SessionResult.model_validate_json(line)
    assert session.status == "limit" and session.num_completions == 2 and len(session.trajectory.traces) == 2
