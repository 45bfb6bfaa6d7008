"""Qwen Code (``@qwen-code/qwen-code``): OpenAI Chat Completions through ``OPENAI_*`` variables.

Its home is ``<home>/.qwen`` (``QWEN_HOME``) with a ``settings.json`` that switches off usage statistics (else it sends
telemetry to an aliyun host), telemetry and the update check; ``QWEN_DISABLE_AUTO_TITLE`` stops the session title side
call. Its background memory agent still runs after a turn that needed no tool (a forked chat with its own system prompt,
which ``side_prompts`` knows, with its other side calls). The instruction is one ``--prompt=<text>`` argument (stdin
when longer than 100 kB): joined with ``=`` so a leading ``-`` is never read as an option. ``--yolo`` bypasses
approvals. Config: ``settings`` (merged into settings.json), ``mcp_servers`` (its ``mcpServers``), ``skills``
(``.qwen/skills``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.harnesses.mcp import McpOptions, skill_files, stdio_server
from polar_cli.harnesses.npm import NpmHarness, deep_merge, dump_json, prompt_flag
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch


class QwenCodeHarness(NpmHarness):
    name: ClassVar[str] = "qwen_code"
    description: ClassVar[str] = "Qwen Code (@qwen-code/qwen-code), OpenAI chat"
    npm_package: ClassVar[str] = "@qwen-code/qwen-code"
    version: ClassVar[str] = "0.15.10"
    binary: ClassVar[str] = "qwen"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("run_shell_command", "command")
    shell_tool_extra: ClassVar[dict[str, Any]] = {"is_background": False, "description": "polar doctor"}
    side_prompts: ClassVar[dict[str, str]] = {
        "You are now acting as the managed memory extraction subagent": "the background memory extraction agent",
        "You are performing a managed memory dream": "the background memory consolidation (dream) agent",
        "You are reviewing this conversation to extract reusable skills": "the background skill review agent",
        "Generate a concise, sentence-case title": "a session title call",
        "You generate session recaps": "a session recap call",
        "Write a short summary label describing what these tool calls accomplished": "a tool-use summary call",
    }
    options: ClassVar[type[BaseModel]] = McpOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: McpOptions = self.parse_config(context.config)
        settings: dict[str, Any] = {
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False},
        }
        if options.mcp_servers:
            settings["mcpServers"] = {name: stdio_server(s) for name, s in options.mcp_servers.items()}
        settings = deep_merge(settings, options.settings)
        model = context.model
        prompt, stdin = prompt_flag("--prompt", context.instruction)
        return HarnessLaunch(
            argv=[*prompt, "--yolo", "--model", model],
            env={
                "QWEN_HOME": f"{context.home}/.qwen",
                "OPENAI_BASE_URL": context.base_url("openai"),
                "OPENAI_API_KEY": context.api_key,
                "OPENAI_MODEL": model,
                "GEMINI_MODEL": model,
                "QWEN_DISABLE_AUTO_TITLE": "1",
            },
            stdin=stdin,
            files={".qwen/settings.json": dump_json(settings), **skill_files(options.skills, ".qwen/skills")},
        )
