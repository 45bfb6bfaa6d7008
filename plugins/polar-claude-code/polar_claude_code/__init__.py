"""Polar plugin: the Claude Code harness (``@anthropic-ai/claude-code``), Anthropic Messages API.

Everything is environment: ``CLAUDE_CONFIG_DIR=<home>/.claude`` (never the user's), ``ANTHROPIC_BASE_URL`` and
``ANTHROPIC_API_KEY`` (sent as ``x-api-key``) from the session, the served model pinned in every model variable (main,
opus/sonnet/haiku defaults, the small fast model, sub-agents), non-essential traffic (title calls, Anthropic hosts),
telemetry, error reporting and the auto-updater off, and ``IS_SANDBOX=1`` so that ``--dangerously-skip-permissions`` is
accepted when running as root. The calls it makes for itself that a session can still meet (a prompt hook's evaluator, a
title) are ``side_prompts``; its Agent tool's sub-agents are not. ``claude -p`` reads the instruction from stdin (then
EOF); ``--output-format json`` prints one result object whose ``is_error`` catches failures that exit 0.

Its package's install script copies the native binary into place, so it runs at install time (npm >= 11 needs that
allowed explicitly). Config: ``settings`` (written as ``<home>/.claude/settings.json``), ``mcp_servers`` (written as
``<home>/.claude/mcp.json``, passed with ``--mcp-config`` and ``--strict-mcp-config``, so a repository's own
``.mcp.json`` starts nothing), ``skills`` (``<home>/.claude/skills``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from polar_cli.api import (
    HarnessContext,
    HarnessLaunch,
    HarnessRun,
    McpOptions,
    NpmHarness,
    RegisterHarness,
    dump_json,
    hookimpl,
    json_lines,
    skill_files,
    startup_timeout_ms,
    stdio_server,
)

MODEL_VARIABLES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
OFF_SWITCHES = (
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    "DISABLE_AUTOUPDATER",
    "DISABLE_TELEMETRY",
    "DISABLE_ERROR_REPORTING",
    "DISABLE_BUG_COMMAND",
    "DISABLE_COST_WARNINGS",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE",
)


class ClaudeCodeHarness(NpmHarness):
    """Claude Code (``@anthropic-ai/claude-code``), Anthropic Messages API."""

    name: ClassVar[str] = "claude_code"
    description: ClassVar[str] = "Claude Code (@anthropic-ai/claude-code), Anthropic Messages API"
    npm_package: ClassVar[str] = "@anthropic-ai/claude-code"
    version: ClassVar[str] = "2.1.197"
    binary: ClassVar[str] = "claude"
    allow_scripts: ClassVar[tuple[str, ...]] = ("@anthropic-ai/claude-code",)
    provider: ClassVar[str] = "anthropic"
    shell_tool: ClassVar[tuple[str, str]] = ("Bash", "command")
    side_prompts: ClassVar[dict[str, str]] = {
        "Generate a concise, sentence-case title": "a session title call",
        "You are evaluating a stop-condition hook in Claude Code": "a prompt hook's evaluator call",
        "You are evaluating a hook condition in Claude Code": "a prompt hook's evaluator call",
    }
    options: ClassVar[type[BaseModel]] = McpOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: McpOptions = self.parse_config(context.config)
        settings = dict(options.settings)
        env = {
            "CLAUDE_CONFIG_DIR": f"{context.home}/.claude",
            "ANTHROPIC_BASE_URL": context.base_url("anthropic"),
            "ANTHROPIC_API_KEY": context.api_key,
            "IS_SANDBOX": "1",
            **dict.fromkeys(MODEL_VARIABLES, context.model),
            **dict.fromkeys(OFF_SWITCHES, "1"),
        }
        argv = ["-p", "--dangerously-skip-permissions", "--model", context.model, "--output-format", "json"]
        files = {".claude/settings.json": dump_json(settings)} if settings else {}
        files.update(skill_files(options.skills, ".claude/skills"))
        if options.mcp_servers:
            servers = {name: {"type": "stdio", **stdio_server(s)} for name, s in options.mcp_servers.items()}
            files[".claude/mcp.json"] = dump_json({"mcpServers": servers})
            argv += ["--mcp-config", f"{context.home}/.claude/mcp.json", "--strict-mcp-config"]
            # wait for the servers before the first call (else it proceeds after 5 s without their tools)
            timeout = str(startup_timeout_ms(options.mcp_servers))
            env.update(MCP_CONNECTION_NONBLOCKING="0", MCP_CONNECT_TIMEOUT_MS=timeout, MCP_TIMEOUT=timeout)
        return HarnessLaunch(argv=argv, env=env, files=files, stdin=context.instruction.encode())

    def check_run(self, run: HarnessRun) -> str | None:
        results = [event for event in json_lines(run.stdout) if event.get("type") == "result"]
        if results and results[-1].get("is_error"):
            result = results[-1]
            return f"claude reported an error ({result.get('subtype')}): {str(result.get('result') or '')[:2000]}"
        failure = super().check_run(run)
        if failure:
            return failure
        if not results:
            return "claude printed no result object"
        return None


@hookimpl
def register_harnesses(register: RegisterHarness) -> None:
    register(ClaudeCodeHarness())
