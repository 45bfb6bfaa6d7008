"""Continue CLI (``@continuedev/cli``, binary ``cn``): OpenAI Chat Completions through its ``openai`` model provider.

``CONTINUE_GLOBAL_DIR=<home>/.continue`` keeps its state in the session home. ``--config`` names a local assistant
file, ``.continue/polar.yaml`` (written as JSON, which is YAML): one model with provider ``openai``, ``apiBase`` the
session's gateway, the served model and its key, for every role, so no Continue account or hub is asked.
``CONTINUE_CLI_ENABLE_TELEMETRY=0`` and ``CONTINUE_METRICS_ENABLED=0`` switch telemetry off; a ``-p`` run makes no
update check. ``-p --auto`` runs headless with every tool allowed; ``--format=json`` prints the answer as a JSON object
with its ``status`` (joined with ``=``: a separate ``json`` after ``-p`` reads as a prompt argument, and stdin is then
ignored). The instruction goes in on stdin (read when stdin is not a terminal and no prompt argument is given).

Config: ``settings`` (merged into polar.yaml, e.g. ``{"models": [...]}`` replaces the model list).
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar_cli.harnesses.npm import NpmHarness, deep_merge, dump_json
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun, json_lines

CONFIG = ".continue/polar.yaml"
ROLES = ["chat", "edit", "apply", "summarize"]


class ContinueCliHarness(NpmHarness):
    name: ClassVar[str] = "continue_cli"
    description: ClassVar[str] = "Continue CLI (@continuedev/cli), OpenAI chat"
    npm_package: ClassVar[str] = "@continuedev/cli"
    version: ClassVar[str] = "1.5.47"
    binary: ClassVar[str] = "cn"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("Bash", "command")

    def build(self, context: HarnessContext) -> HarnessLaunch:
        config: dict[str, Any] = {
            "name": "polar",
            "version": "1.0.0",
            "schema": "v1",
            "models": [
                {
                    "name": context.model,
                    "provider": "openai",
                    "model": context.model,
                    "apiBase": context.base_url("openai"),
                    "apiKey": context.api_key,
                    "roles": ROLES,
                }
            ],
        }
        config = deep_merge(config, self.settings(context))
        return HarnessLaunch(
            argv=["-p", "--auto", "--format=json", "--config", f"{context.home}/{CONFIG}"],
            env={
                "CONTINUE_GLOBAL_DIR": f"{context.home}/.continue",
                "CONTINUE_CLI_ENABLE_TELEMETRY": "0",
                "CONTINUE_METRICS_ENABLED": "0",
            },
            files={CONFIG: dump_json(config)},
            stdin=context.instruction.encode(),
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        answers = [event for event in json_lines(run.stdout) if "status" in event]
        if not answers:
            return "continue_cli printed no JSON answer"
        if answers[-1]["status"] != "success":
            return f"continue_cli answered with status {answers[-1]['status']}: {answers[-1].get('response')}"
        return None
