"""A shell agent that plays a plan per session, so a test chooses each session's outcome and reward: the sessions of
a task claim an ordinal each (a directory under ``$CLAIMS``) and act by ``$PLAN[ordinal]``; the ``test_on_output``
evaluator gives 1.0 when the agent wrote ``passed``, else 0.0. Runs on the scripted backend (``metadata.script``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from polar_cli.models import TaskRequest
from tests.gateway.test_node import SCRIPT

AGENT = """
import json, os, sys, time, urllib.request
claims = os.environ["CLAIMS"]
os.makedirs(claims, exist_ok=True)
ordinal = 0
while True:
    try:
        os.mkdir(os.path.join(claims, str(ordinal)))
        break
    except FileExistsError:
        ordinal += 1
act = os.environ["PLAN"].split(",")[ordinal]
if act != "none":
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
    body = json.dumps({"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "go"}]})
    json.load(urllib.request.urlopen(urllib.request.Request(url, data=body.encode(), headers=headers)))
open(os.path.join(claims, str(ordinal), "called"), "w").close()
if act == "gate":
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.05)
if act in ("pass", "gate"):
    open("passed", "w").close()
if act == "crash":
    sys.exit("crashed as planned")
if act == "hang":
    time.sleep(3600)
"""
"""Each session claims the next ordinal and plays ``PLAN[ordinal]``: ``pass`` (a model call, reward 1), ``fail``
(a call, reward 0), ``crash`` (a call, exit 1: status error), ``none`` (no call, exit 0), ``hang`` (a call, then
sleeps), ``gate`` (a call, then waits for ``$GATE`` and passes); each writes ``called`` in its claim once past its
call."""


def planned(task_id: str, plan: list[str], root: Path, **metadata: Any) -> TaskRequest:
    return TaskRequest.model_validate({
        "task_id": task_id,
        "instruction": f"do {task_id}",
        "num_samples": len(plan),
        "timeout_seconds": 60,
        "agent": {
            "harness": "shell",
            "env": {"CLAIMS": str(root / "claims" / task_id), "PLAN": ",".join(plan), "GATE": str(gate(root, task_id))},
            "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
        },
        "builder": {"strategy": "per_request"},
        "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f passed"}},
        "metadata": {"script": SCRIPT, **metadata},
    })  # fmt: skip


def gate(root: Path, task_id: str) -> Path:
    return root / "gates" / task_id


def called(root: Path, task_id: str, n: int, timeout: float = 60) -> None:
    """Until ``n`` sessions of the task have made their model call."""
    end = time.monotonic() + timeout
    while len(list((root / "claims" / task_id).glob("*/called"))) < n:
        assert time.monotonic() < end, f"{task_id}: {n} sessions did not make their call"
        time.sleep(0.05)
