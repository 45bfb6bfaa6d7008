"""Polar plugin: the mini-SWE-agent harness (PyPI ``mini-swe-agent``, the ``mini`` CLI), OpenAI Chat Completions.

mini is driven as it ships: its own ``mini.yaml`` (system and instance templates, the ``bash`` tool), its litellm
model and its local environment (every action a fresh ``bash`` subprocess in the working directory). The adapter adds
one config file in the session home, merged after ``mini.yaml`` (``mini -c mini.yaml -c <home>/.polar/mini.yaml``):
the task itself (``run.task``, so the instruction never passes through argv), ``agent.mode: yolo`` and
``confirm_exit: false`` (no prompt: the run ends when the model submits), no cost limit (a served model has no price),
the trajectory file in the session home, and the model ``openai/<served model>`` with ``model_kwargs.api_base`` and
``api_key`` pointing at the session.

Offline: litellm reads its bundled model cost map (``LITELLM_LOCAL_MODEL_COST_MAP=True``) instead of fetching it at
import; ``MSWEA_COST_TRACKING=ignore_errors`` keeps an unpriced model from aborting the run; ``MSWEA_CONFIGURED``
skips the first-run setup prompt and ``MSWEA_GLOBAL_CONFIG_DIR`` keeps its ``.env`` in the session home.

mini ends a run when the model's command prints ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` first (``echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, as its prompt tells the model), so the doctor's final turn is that tool call,
not a text answer (a turn without a tool call is a format error mini answers by asking again).

Config: ``settings`` (merged into the adapter's config file, e.g. ``{"agent": {"step_limit": 50}}`` or
``{"model": {"model_kwargs": {"temperature": 0.0}}}``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import yaml

from polar_cli.api import HarnessContext, HarnessLaunch, HarnessRun, PypiHarness, RegisterHarness, deep_merge, hookimpl

CONFIG_FILE = ".polar/mini.yaml"
TRAJECTORY_FILE = ".polar/mini.traj.json"
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class MiniSweAgentHarness(PypiHarness):
    """mini-SWE-agent (``mini-swe-agent`` on PyPI), OpenAI Chat Completions through litellm."""

    name: ClassVar[str] = "mini_swe_agent"
    description: ClassVar[str] = "mini-SWE-agent (PyPI mini-swe-agent, the mini CLI), OpenAI chat via litellm"
    pypi_package: ClassVar[str] = "mini-swe-agent"
    version: ClassVar[str] = "2.4.6"
    binary: ClassVar[str] = "mini"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("bash", "command")

    def run_config(self, context: HarnessContext) -> dict[str, Any]:
        config: dict[str, Any] = {
            "run": {"task": context.instruction},
            "agent": {
                "mode": "yolo",
                "confirm_exit": False,
                "cost_limit": 0,
                "output_path": f"{context.home}/{TRAJECTORY_FILE}",
            },
            "model": {
                "model_name": f"openai/{context.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {"api_base": context.base_url("openai"), "api_key": context.api_key},
            },
            "environment": {"cwd": context.workdir},
        }
        return deep_merge(config, self.settings(context))

    def build(self, context: HarnessContext) -> HarnessLaunch:
        config_path = f"{context.home}/{CONFIG_FILE}"
        return HarnessLaunch(
            argv=["-c", "mini.yaml", "-c", config_path],
            env={
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_GLOBAL_CONFIG_DIR": f"{context.home}/.config/mini-swe-agent",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
            },
            files={CONFIG_FILE: yaml.safe_dump(self.run_config(context), allow_unicode=True, sort_keys=False)},
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        if "Saved trajectory to" not in run.stdout:
            return "mini did not finish its run (no trajectory was saved)"
        return None

    def doctor_script(self, command: str) -> list[dict[str, Any]]:
        """The shell call, then mini's own way to finish: a ``bash`` call that echoes the submit marker."""
        first, _ = super().doctor_script(command)
        submit = {
            "id": "call_polar_doctor_2",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"echo {SUBMIT}"})},
        }
        done = {"role": "assistant", "content": "The file is written. Polar doctor: done.", "tool_calls": [submit]}
        return [first, done]


@hookimpl
def register_harnesses(register: RegisterHarness) -> None:
    register(MiniSweAgentHarness())
