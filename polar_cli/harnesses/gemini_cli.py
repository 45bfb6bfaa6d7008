"""Gemini CLI (``@google/gemini-cli``): Google ``streamGenerateContent`` through ``GOOGLE_GEMINI_BASE_URL``.

``GEMINI_CLI_HOME=<home>`` puts its ``.gemini/settings.json`` in the session home: API-key auth selected (without it:
exit 41), usage statistics, telemetry and auto-update off. ``--skip-trust`` (else exit 55), ``--yolo`` bypasses
approvals, ``-m`` pins the model (without it the CLI first makes a router side call). The instruction is one
``--prompt=<text>`` argument (stdin when longer than 100 kB). Config: ``settings`` (merged into settings.json),
``mcp_servers`` (its ``mcpServers``), ``skills`` (``.gemini/skills``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.harnesses.mcp import McpOptions, skill_files, stdio_server
from polar_cli.harnesses.npm import NpmHarness, deep_merge, dump_json, prompt_flag
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch


class GeminiCliHarness(NpmHarness):
    name: ClassVar[str] = "gemini_cli"
    description: ClassVar[str] = "Gemini CLI (@google/gemini-cli), Google generateContent"
    npm_package: ClassVar[str] = "@google/gemini-cli"
    version: ClassVar[str] = "0.61.0"
    binary: ClassVar[str] = "gemini"
    provider: ClassVar[str] = "google"
    shell_tool: ClassVar[tuple[str, str]] = ("run_shell_command", "command")
    shell_tool_extra: ClassVar[dict[str, Any]] = {"description": "polar doctor"}
    side_prompts: ClassVar[dict[str, str]] = {"You are a specialized Task Routing AI": "the model router's call"}
    options: ClassVar[type[BaseModel]] = McpOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: McpOptions = self.parse_config(context.config)
        settings: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        }
        if options.mcp_servers:
            settings["mcpServers"] = {name: stdio_server(s) for name, s in options.mcp_servers.items()}
        settings = deep_merge(settings, options.settings)
        prompt, stdin = prompt_flag("--prompt", context.instruction)
        return HarnessLaunch(
            argv=[*prompt, "--yolo", "--skip-trust", "--model", context.model],
            env={
                "GEMINI_CLI_HOME": context.home,
                "GEMINI_API_KEY": context.api_key,
                "GOOGLE_GEMINI_BASE_URL": context.base_url("google"),
                "GEMINI_MODEL": context.model,
            },
            stdin=stdin,
            files={".gemini/settings.json": dump_json(settings), **skill_files(options.skills, ".gemini/skills")},
        )
