"""A SWE-like Docker image (a git repository with a buggy script and its test) and tasks over it, run by the shell
harness's reference agent with the scripted backend playing the model: what tests/runtimes/test_pool_docker.py and
bench/sandboxes.py share."""

from __future__ import annotations

import secrets
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from polar_cli.harnesses.shell import REFERENCE_AGENT, reference_agent_source
from polar_cli.models import TaskRequest

DOCKERFILE = """FROM {base}
LABEL polar.test=swe-image
RUN git config --system user.email polar@example.invalid && git config --system user.name polar \\
 && mkdir /repo && cd /repo && git init -q -b main \\
 && printf '#!/bin/sh\\necho $(( $1 - $2 ))\\n' > add.sh \\
 && printf '#!/bin/sh\\ntest "$(sh add.sh 2 3)" = 5 && test "$(sh add.sh 1 1)" = 2\\n' > test.sh \\
 && git add . && git commit -qm base
"""
FIX = "sed -i 's/-/+/' add.sh"
# A short agent in bash alone (no Node start-up): one model call over /dev/tcp, then the command of the task's
# single scripted tool call, run as given (``swe_task(..., bash_agent=True)``)
BASH_AGENT = r"""u=${OPENAI_BASE_URL#http://}; hp=${u%%/*}; path=/${u#*/}/chat/completions
body='{"model":"'"$POLAR_MODEL"'","messages":[{"role":"user","content":"fix add.sh"}]}'
exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}"
h='POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n'
printf "$h"'Content-Length: %s\r\nConnection: close\r\n\r\n%s' "$path" "$hp" "$OPENAI_API_KEY" "${#body}" "$body" >&3
head -1 <&3 && cat <&3 >/dev/null
eval "$POLAR_FIX"
"""
RESET_CHECK = 'test "$(sh add.sh 2 2)" = 0 && test -f /etc/polar-prepared'


def build_image(base: str, name: str = "polar-swe") -> str:
    """Build the image from ``base`` under a fresh tag; the caller removes it (``docker rmi -f TAG``)."""
    tag = f"{name}:{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "Dockerfile").write_text(DOCKERFILE.format(base=base))
        subprocess.run(["docker", "build", "-q", "-t", tag, folder], check=True, capture_output=True)
    return tag


def remove_image(tag: str) -> None:
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def swe_task(
    image: str,
    task_id: str,
    command: str,
    *,
    reuse: str = "reset",
    refresh: bool = False,
    prepare_seconds: float = 2.0,
    max_sessions: int = 4,
    bash_agent: bool = False,
) -> TaskRequest:
    """A task whose agent runs ``command`` in /repo (one tool call), then answers; the reward is ``sh test.sh``.
    ``bash_agent``: :data:`BASH_AGENT` instead of the reference agent (one model call, then ``command``)."""
    runtime: dict[str, Any] = {
        "backend": "docker", "image": image, "workdir": "/repo", "config": {"pull": "never"},
        "prepare": [{"command": f"sleep {prepare_seconds:g} && echo ready > /etc/polar-prepared"}],
        "reuse": reuse, "reuse_max_sessions": max_sessions, "reset": {"git": "/repo", "check": RESET_CHECK},
    }  # fmt: skip
    agent: dict[str, Any] = {
        "harness": "shell",
        "config": {
            "command": f'exec node "$HOME/{REFERENCE_AGENT}"',
            "files": {REFERENCE_AGENT: reference_agent_source()},
        },
    }
    script: list[dict[str, Any]] = [
        {"content": None, "tool_calls": [{"function": {"name": "bash", "arguments": {"command": command}}}]},
        {"content": "done"},
    ]
    if bash_agent:
        agent = {"harness": "shell", "env": {"POLAR_FIX": command}, "config": {"command": BASH_AGENT}}
        script = [{"content": "done"}]
    return TaskRequest.model_validate({
        "task_id": task_id,
        "instruction": f"fix add.sh ({task_id})",
        "timeout_seconds": 120,
        "runtime": runtime,
        "agent": agent,
        "builder": {"strategy": "per_request"},
        "evaluator": {"strategy": "test_on_output", "refresh_runtime": refresh, "config": {"command": "sh test.sh"}},
        "metadata": {"script": script},
    })  # fmt: skip
