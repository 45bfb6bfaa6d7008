"""Nanocoder (``@nanocollective/nanocoder``): OpenAI Chat Completions through one provider in agents.config.json.

``NANOCODER_CONFIG_DIR=<home>/.config/nanocoder`` holds ``agents.config.json`` with one provider ``polar`` (the
session's base URL and key, the served model) and, being explicit, stops it from reading an ``agents.config.json``
in the working directory; ``NANOCODER_DATA_DIR`` keeps its sessions and logs in the home too. ``run`` is its
non-interactive mode: ``--plain`` (no Ink UI), ``--mode yolo`` (every tool runs without asking),
``--trust-directory`` (no first-run trust prompt), ``--json`` (one JSON report on stdout, whose ``kind`` must be
``success``).
Every option goes before ``run``; the instruction is the one argument after it (nanocoder joins the arguments after
``run`` into the prompt, skipping its own flags: an instruction that is exactly one of them, e.g. ``--json``,
would be dropped). It needs Node 22 or newer: Node 24 is installed beside it (``node_version``) and runs
``dist/cli.js``. Config: ``settings`` (merged into the provider entry).
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar_cli.harnesses.npm import NpmHarness, argv_instruction, deep_merge, dump_json, json_object
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun


class NanocoderHarness(NpmHarness):
    name: ClassVar[str] = "nanocoder"
    description: ClassVar[str] = "Nanocoder (@nanocollective/nanocoder), OpenAI chat"
    npm_package: ClassVar[str] = "@nanocollective/nanocoder"
    version: ClassVar[str] = "1.30.0"
    binary: ClassVar[str] = "nanocoder"
    node_version: ClassVar[str] = "24.21.0"  # it needs >= 22 (on Node 20 it fails at start)
    entry: ClassVar[str] = "dist/cli.js"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("execute_bash", "command")

    def build(self, context: HarnessContext) -> HarnessLaunch:
        provider: dict[str, Any] = {
            "name": "polar",
            "baseUrl": context.base_url("openai"),
            "apiKey": context.api_key,
            "models": [context.model],
        }
        provider = deep_merge(provider, self.settings(context))
        home = context.home
        argv = ["--provider", "polar", "--model", context.model, "--mode", "yolo", "--trust-directory", "--plain",
                "--json", "run", argv_instruction(self.name, context.instruction)]  # fmt: skip
        return HarnessLaunch(
            argv=argv,
            env={
                "NANOCODER_CONFIG_DIR": f"{home}/.config/nanocoder",
                "NANOCODER_DATA_DIR": f"{home}/.local/share/nanocoder",
                "NANOCODER_LOG_DISABLE_FILE": "1",
            },
            files={".config/nanocoder/agents.config.json": dump_json({"nanocoder": {"providers": [provider]}})},
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        report = json_object(run.stdout)
        if report is None:
            return "nanocoder printed no JSON report"
        if report.get("kind") != "success":
            return f"nanocoder's run ended {report.get('kind')}: {report.get('error') or report.get('finalText')}"
        return None
