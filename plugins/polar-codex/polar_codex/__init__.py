"""Polar plugin: the Codex CLI harness (``@openai/codex``), OpenAI Responses API.

``CODEX_HOME=<home>/.codex`` holds ``config.toml``: one model provider ``polar`` (``wire_api = "responses"``, the
only one codex accepts, its key read from ``POLAR_API_KEY``), approvals off and a full-access sandbox (the runtime is
the sandbox), plugin sync, analytics, feedback, history and the update check off, and the model pinned everywhere
it is named (``model``, ``review_model``). ``--strict-config`` makes a misspelt key an error instead of a silent
no-op. ``codex exec -`` reads the instruction from stdin (then EOF), so nothing in it is parsed as an option.

Config: ``settings`` (merged into config.toml, e.g. ``{"model_context_window": 32768}``), ``mcp_servers`` (its
``[mcp_servers.NAME]`` tables), ``skills`` (``<home>/.codex/skills``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.api import (
    HarnessContext,
    HarnessLaunch,
    McpOptions,
    NpmHarness,
    RegisterHarness,
    deep_merge,
    dump_toml,
    hookimpl,
    skill_files,
    stdio_server,
)

KEY_VARIABLE = "POLAR_API_KEY"


class CodexHarness(NpmHarness):
    """OpenAI Codex CLI (``@openai/codex``), OpenAI Responses API."""

    name: ClassVar[str] = "codex"
    description: ClassVar[str] = "OpenAI Codex CLI (@openai/codex), Responses API"
    npm_package: ClassVar[str] = "@openai/codex"
    version: ClassVar[str] = "0.169.0"
    binary: ClassVar[str] = "codex"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("exec_command", "cmd")
    options: ClassVar[type[BaseModel]] = McpOptions

    def config_toml(self, context: HarnessContext) -> dict[str, Any]:
        config: dict[str, Any] = {
            "model": context.model,
            "review_model": context.model,
            "model_provider": "polar",
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
            "model_providers": {
                "polar": {
                    "name": "polar",
                    "base_url": context.base_url("openai"),
                    "env_key": KEY_VARIABLE,
                    "wire_api": "responses",
                }
            },
            "features": {"plugins": False},
            "analytics": {"enabled": False},
            "feedback": {"enabled": False},
            "history": {"persistence": "none"},
        }
        options: McpOptions = self.parse_config(context.config)
        if options.mcp_servers:
            config["mcp_servers"] = {
                # required: wait for it before the first call (else its tools are omitted while it starts), and
                # fail the run when it cannot start
                name: {**stdio_server(s), "startup_timeout_sec": s.startup_timeout_seconds, "required": True}
                for name, s in options.mcp_servers.items()
            }
        return deep_merge(config, options.settings)

    def build(self, context: HarnessContext) -> HarnessLaunch:
        argv = ["exec", "--skip-git-repo-check", "--strict-config", "--color", "never", "-C", context.workdir, "-"]
        return HarnessLaunch(
            argv=argv,
            env={"CODEX_HOME": f"{context.home}/.codex", KEY_VARIABLE: context.api_key},
            files={
                ".codex/config.toml": dump_toml(self.config_toml(context)),
                **skill_files(self.parse_config(context.config).skills, ".codex/skills"),
            },
            stdin=context.instruction.encode(),
        )


@hookimpl
def register_harnesses(register: RegisterHarness) -> None:
    register(CodexHarness())
