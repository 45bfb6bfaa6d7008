"""Helpers for testing a harness adapter with its real CLI (Polar's own suites and third-party plugins alike).

``doctor_report(name)`` runs ``polar doctor`` once per (harness, runtime) per process and caches the report, so
several tests can assert on one real run. ``polar_run(name, folder)`` runs the real ``polar run`` command on a task that
asks the harness to write a file (the scripted backend plays the model, ``test_on_output`` checks the file) and returns
the SessionResult with the completions the session's journal holds, for ``polar_cli.builders.verify``;
``side_call_run`` and ``check_side_chain`` do the same for a run whose harness also makes a call for itself (a side
chain: no reward under the default ``reward_to``).
``missing_cli_reason(harness)`` says why a test cannot run: under CI
(``CI`` set) a missing CLI is a failure, elsewhere a skip; the caller decides (``pytest.fail`` / ``pytest.skip``), or
``require_cli(name)`` does both in a pytest test.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from polar_cli.harnesses.doctor import DEFAULT_IMAGE, DoctorReport, run_doctor
from polar_cli.interfaces.harness import Harness, HarnessContext
from polar_cli.models import Completion, SessionResult
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.proxy import read_journal
from polar_cli.registry import get_harness

RUN_FILE = "polar-run.txt"
# The session dir as a git repo, so that refresh_runtime evaluation can move the agent's file as a patch.
GIT_PREPARE = (
    "git init -q && git -c user.name=polar -c user.email=polar@example.invalid commit -q --allow-empty -m base"
)

_reports: dict[tuple[str, str], DoctorReport] = {}


def in_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")


def missing_cli_reason(harness: Harness) -> str | None:
    """Why ``harness``'s CLI cannot be driven here, or ``None`` when it is installed."""
    if harness.is_installed():
        return None
    return f"{harness.name} {harness.version} is not installed (run .ci/setup_harnesses.sh or polar harness install)"


NASTY_INSTRUCTION = "--help \"double\" 'single' $(touch pwned) `touch pwned2`\nsecond line"
"""An instruction a shell or an option parser would misread: an adapter must pass it verbatim."""


def launch_context(name: str, **changes: Any) -> HarnessContext:
    """A HarnessContext for unit tests of harness ``name``'s launch (its tools dir, a gateway URL that is never
    called, :data:`NASTY_INSTRUCTION`), with ``changes`` applied."""
    base = HarnessContext(
        instruction=NASTY_INSTRUCTION,
        model="served-model",
        api_key="sk-session",
        base_urls={"openai": "http://127.0.0.1:9/s/abc/v1"},
        home="/h/home",
        workdir="/h/session",
        tools=str(get_harness(name).tools_dir()),
    )
    return replace(base, **changes)


def require_cli(name: str) -> None:
    """In a pytest test: skip when harness ``name``'s CLI is not installed, fail instead under CI."""
    import pytest

    reason = missing_cli_reason(get_harness(name))
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)


def doctor_report(name: str, runtime: str = "local", *, save_requests: Path | None = None) -> DoctorReport:
    """The doctor report of ``name`` in ``runtime``, run once per process (never installs: tests see what is there)."""
    key = (name, runtime)
    if key not in _reports:
        report = asyncio.run(run_doctor(get_harness(name), runtime=runtime, install=False, save_requests=save_requests))
        _reports[key] = report
    return _reports[key]


def describe(report: DoctorReport) -> str:
    """Every step, for an assertion message."""
    lines = [f"{s.status:4} {s.name}: {s.detail}" for s in report.steps]
    return f"polar doctor {report.harness} ({report.runtime}, {report.seconds:.1f} s)\n" + "\n".join(lines)


@dataclass
class RunReport:
    """What one ``polar run`` of a harness left: its exit status, output, result and journaled completions."""

    exit_code: int
    output: str
    result: SessionResult | None
    completions: list[Completion]

    def describe(self) -> str:
        result = self.result.model_dump(mode="json", exclude={"trajectory"}) if self.result else None
        return f"polar run exited {self.exit_code}\n{self.output[-6000:]}\nresult: {json.dumps(result)[:4000]}"


def run_task(
    name: str, runtime: str = "local", *, refresh_runtime: bool = False, image: str | None = None
) -> dict[str, Any]:
    """A TaskRequest (as data) asking harness ``name`` to write RUN_FILE through its own shell tool.

    The scripted backend plays the model (the adapter's doctor script); ``test_on_output`` scores 1.0 only when the
    file holds the expected text; with ``refresh_runtime`` that check runs in a fresh runtime after the agent's patch.
    """
    harness = get_harness(name)
    left, right = secrets.token_hex(4), secrets.token_hex(4)
    command = f"printf '%s%s\\n' {left} {right} > {RUN_FILE} && cat {RUN_FILE}"
    runtime_spec: dict[str, Any] = {"backend": runtime}
    if runtime != "local":
        runtime_spec["image"] = image or DEFAULT_IMAGE
    if refresh_runtime:
        runtime_spec["prepare"] = [{"command": GIT_PREPARE}]
    return {
        "task_id": f"run-{name}-{runtime}",
        "instruction": f"Use your shell tool to write the file {RUN_FILE}, then say that you are done.",
        "timeout_seconds": 300,
        "runtime": runtime_spec,
        "agent": {"harness": name, "model_name": "polar-test", "config": harness.doctor_config()},
        "builder": {"strategy": "prefix_merging"},
        "evaluator": {
            "strategy": "test_on_output",
            "refresh_runtime": refresh_runtime,
            "config": {"command": f'test "$(cat {RUN_FILE})" = {left + right}'},
        },
        "metadata": {SCRIPT_KEY: harness.doctor_script(command)},
    }


def polar_run(
    name: str, folder: Path, runtime: str = "local", *, refresh_runtime: bool = False, image: str | None = None
) -> RunReport:
    """Run ``polar run TASK.json`` as a user would (a subprocess of this Python) on ``run_task``'s task."""
    folder.mkdir(parents=True, exist_ok=True)
    task_file = folder / "task.json"
    task = run_task(name, runtime, refresh_runtime=refresh_runtime, image=image)
    task_file.write_text(json.dumps(task, indent=2), encoding="utf-8")
    return polar_run_file(task_file, folder)[0]


def side_call_run(name: str, folder: Path, side_answer: str, *, config: dict[str, Any] | None = None) -> RunReport:
    """``polar run`` of a task the agent answers without a tool ("Hello."), after which the harness makes a call for
    itself (Qwen Code's memory agent runs after such a turn; Claude Code evaluates a prompt hook ``config`` sets up);
    the script answers that call with ``side_answer``. Scored by ``session_completion`` under the default
    ``reward_to``."""
    folder.mkdir(parents=True, exist_ok=True)
    task = run_task(name)
    task.update(instruction="Say hello.", evaluator={"strategy": "session_completion"})
    task["agent"]["config"] = config or {}
    task["metadata"] = {SCRIPT_KEY: [{"role": "assistant", "content": "Hello."},
                                     {"role": "assistant", "content": side_answer}]}  # fmt: skip
    task_file = folder / "task.json"
    task_file.write_text(json.dumps(task, indent=2), encoding="utf-8")
    return polar_run_file(task_file, folder)[0]


def check_side_chain(report: RunReport, reason: str) -> None:
    """Raise AssertionError unless the run completed with reward 1.0 in two chains: the main conversation (the
    reward, trainable) and the harness's own call (role ``side`` for ``reason``, no reward, not trainable), and the
    trajectory passes ``verify``."""
    from polar_cli.builders import verify

    result = report.result
    if report.exit_code != 0 or result is None or (result.status, result.reward) != ("completed", 1.0):
        raise AssertionError(report.describe())
    got = [(t.role, t.role_reason, t.reward, t.trainable) for t in result.trajectory.traces]
    expected = [("main", "the session's first chain", 1.0, True), ("side", reason, None, False)]
    if got != expected:
        raise AssertionError(f"traces {got}, expected {expected}\n{report.describe()}")
    verify(result.trajectory, report.completions, raise_on_violation=True)


def polar_run_file(task_file: Path, folder: Path, *args: str, cwd: Path | None = None) -> list[RunReport]:
    """``polar run TASK_FILE ARGS...`` in a subprocess, results and journals under ``folder``: one report per
    session (one report with no result when none was written)."""
    out, data = folder / "out.jsonl", folder / "polar-data"
    out.unlink(missing_ok=True)  # a fresh results file each run (polar run never replaces one)
    argv = [sys.executable, "-m", "polar_cli", "run", str(task_file), *args, "--out", str(out), "--data-dir",
            str(data), "--no-install"]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd or folder, timeout=600)
    output = done.stdout + done.stderr
    lines = out.read_text().splitlines() if out.is_file() else []
    if not lines:
        return [RunReport(done.returncode, output, None, [])]
    results = [SessionResult.model_validate_json(line) for line in lines]
    return [
        RunReport(done.returncode, output, r, read_journal(data / "journal" / f"{r.session_id}.jsonl")) for r in results
    ]


def check_run(report: RunReport) -> None:
    """Raise AssertionError unless the run completed with reward 1.0, two or more completions, and a trajectory
    that passes ``polar_cli.builders.verify`` against the journaled completions."""
    from polar_cli.builders import verify

    result = report.result
    if report.exit_code != 0 or result is None:
        raise AssertionError(report.describe())
    if (result.status, result.reward) != ("completed", 1.0) or result.num_completions < 2:
        raise AssertionError(report.describe())
    if len(report.completions) != result.num_completions:
        raise AssertionError(f"journal holds {len(report.completions)} completions\n{report.describe()}")
    verify(result.trajectory, report.completions, raise_on_violation=True)


def check_streamed(report: RunReport) -> None:
    """Raise AssertionError unless the harness streamed at least one call and every streamed call was passed through
    (re-encoded chunk by chunk, ``metadata.stream_mode == "passthrough"``), not replayed."""
    streamed = [c for c in report.completions if c.metadata.get("stream")]
    if not streamed:
        raise AssertionError(f"no call of this run was streamed\n{report.describe()}")
    modes = sorted({str(c.metadata.get("stream_mode")) for c in streamed})
    if modes != ["passthrough"]:
        raise AssertionError(f"streamed calls went out as {modes}, not passthrough\n{report.describe()}")
