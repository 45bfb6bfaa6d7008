"""opencode (``opencode-ai``): OpenAI Chat Completions through its bundled ``@ai-sdk/openai-compatible`` provider.

``XDG_*`` point into the session home, so its config (``.config/opencode/opencode.json``: one provider ``polar``,
``model`` and ``small_model`` both the served model, the title agent disabled, every permission allowed, autoupdate
and sharing off), data, cache and state stay there. The ``OPENCODE_DISABLE_*`` switches stop model-list fetches,
update checks, LSP downloads, default plugins and reading Claude Code's files. ``opencode run`` quotes message
arguments that contain spaces, so the instruction goes in on stdin (verbatim, then EOF). ``--format json`` prints
its events; an ``error`` event is a failure even when it exits 0.

Known: at start it tries a background ``npm install @opencode-ai/plugin`` into its config dir; offline that fails
with a logged warning only. Config: ``settings`` (merged into opencode.json), ``model_limits``
(``{"context": N, "output": N}``), ``mcp_servers`` (its ``mcp``, ``type: local``), ``skills``
(``.config/opencode/skills``).
"""

from __future__ import annotations

import posixpath
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.harnesses.mcp import McpOptions, skill_files
from polar_cli.harnesses.npm import NpmHarness, deep_merge, dump_json
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun, json_lines

# After the CLI's own prefix (``OPENCODE_``; kilocode's fork reads ``KILO_``)
OFF_SWITCHES = (
    "DISABLE_AUTOUPDATE",
    "DISABLE_MODELS_FETCH",
    "DISABLE_LSP_DOWNLOAD",
    "DISABLE_SHARE",
    "DISABLE_DEFAULT_PLUGINS",
    "DISABLE_CLAUDE_CODE",
)


class OpencodeOptions(McpOptions):
    """``AgentSpec.config`` of ``opencode``."""

    model_limits: dict[str, Any] | None = Field(default=None, description="the model's limits, e.g. {context: 32768}")


class OpencodeHarness(NpmHarness):
    name: ClassVar[str] = "opencode"
    description: ClassVar[str] = "opencode (opencode-ai), OpenAI chat via @ai-sdk/openai-compatible"
    npm_package: ClassVar[str] = "opencode-ai"
    version: ClassVar[str] = "1.18.33"
    binary: ClassVar[str] = "opencode"
    allow_scripts: ClassVar[tuple[str, ...]] = ("opencode-ai",)  # its postinstall puts the native binary in place
    provider: ClassVar[str] = "openai"
    side_prompts: ClassVar[dict[str, str]] = {"You are a title generator": "the title agent"}
    shell_tool: ClassVar[tuple[str, str]] = ("bash", "command")
    shell_tool_extra: ClassVar[dict[str, Any]] = {"description": "polar doctor"}
    options: ClassVar[type[BaseModel]] = OpencodeOptions
    config_file: ClassVar[str] = ".config/opencode/opencode.json"
    """Where the config goes, relative to the session home (``XDG_CONFIG_HOME`` is ``<home>/.config``)."""
    config_schema: ClassVar[str] = "https://opencode.ai/config.json"
    env_prefix: ClassVar[str] = "OPENCODE_"
    extra_env: ClassVar[dict[str, str]] = {}
    """Further variables of a fork (its own off switches)."""

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: OpencodeOptions = self.parse_config(context.config)
        model_entry: dict[str, Any] = {"name": context.model}
        if options.model_limits:
            model_entry["limit"] = dict(options.model_limits)
        config: dict[str, Any] = {
            "$schema": self.config_schema,
            "provider": {
                "polar": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Polar",
                    "options": {"baseURL": context.base_url("openai"), "apiKey": context.api_key},
                    "models": {context.model: model_entry},
                }
            },
            "model": f"polar/{context.model}",
            "small_model": f"polar/{context.model}",
            "autoupdate": False,
            "share": "disabled",
            "agent": {"title": {"disable": True}},
            "permission": {
                "edit": "allow",
                "bash": "allow",
                "webfetch": "allow",
                "external_directory": "allow",
                "doom_loop": "allow",
            },
        }
        if options.mcp_servers:
            config["mcp"] = {
                name: {
                    "type": "local",
                    "command": [s.command, *s.args],
                    "environment": dict(s.env),
                    "enabled": True,
                    "timeout": round(s.startup_timeout_seconds * 1000),
                }
                for name, s in options.mcp_servers.items()
            }
        config = deep_merge(config, options.settings)
        home = context.home
        env = {
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_STATE_HOME": f"{home}/.local/state",
            **{self.env_prefix + switch: "1" for switch in OFF_SWITCHES},
            **self.extra_env,
        }
        argv = ["run", "--pure", "--auto", "--title", "polar", "--format", "json", "--model", f"polar/{context.model}"]
        return HarnessLaunch(
            argv=argv,
            env=env,
            files={
                self.config_file: dump_json(config),
                **skill_files(options.skills, posixpath.join(posixpath.dirname(self.config_file), "skills")),
            },
            stdin=context.instruction.encode(),
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        events = json_lines(run.stdout)
        errors = [event for event in events if event.get("type") == "error"]
        if errors:
            error = errors[-1].get("error")
            detail = error.get("data", {}).get("message") or error.get("name") if isinstance(error, dict) else error
            return f"{self.name} reported an error: {detail}"
        if not any(event.get("type") == "step_finish" for event in events):
            return f"{self.name} finished no step (no step_finish event)"
        return None
