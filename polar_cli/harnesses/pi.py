"""pi (``@mariozechner/pi-coding-agent``): OpenAI Chat Completions by default.

``PI_CODING_AGENT_DIR=<home>/.pi/agent`` holds ``models.json`` with one provider ``polar`` pointing at the session;
``PI_OFFLINE=1`` stops its startup network calls. The instruction goes in on stdin (pi reads a piped prompt, then
EOF), so a leading ``-`` or ``@`` in it is never taken for an option or a file include. ``--mode json`` prints pi's
event stream, which is how an empty turn that exits 0 (pi's answer to a response it could not parse) is caught.

Config: ``api`` (``openai-completions`` default, ``openai-responses``, ``anthropic-messages``), ``settings`` (merged
into the provider entry of models.json, e.g. ``{"compat": {...}}``), ``skills`` (``.pi/agent/skills``). pi has no
MCP client (by design), so ``mcp_servers`` is not a pi option.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from polar_cli.harnesses.mcp import SkillsOptions, skill_files
from polar_cli.harnesses.npm import NpmHarness, deep_merge, dump_json
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun, json_lines

PiApi = Literal["openai-completions", "openai-responses", "anthropic-messages"]
# pi's api name -> the session base URL family it talks to
APIS: dict[PiApi, str] = {
    "openai-completions": "openai",
    "openai-responses": "openai",
    "anthropic-messages": "anthropic",
}


class PiOptions(SkillsOptions):
    """``AgentSpec.config`` of ``pi``."""

    api: PiApi = Field(default="openai-completions", description="the provider API pi speaks to the session")


class PiHarness(NpmHarness):
    name: ClassVar[str] = "pi"
    description: ClassVar[str] = "pi coding agent (@mariozechner/pi-coding-agent), OpenAI chat by default"
    npm_package: ClassVar[str] = "@mariozechner/pi-coding-agent"
    version: ClassVar[str] = "0.73.1"
    binary: ClassVar[str] = "pi"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("bash", "command")
    options: ClassVar[type[BaseModel]] = PiOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: PiOptions = self.parse_config(context.config)
        provider: dict[str, Any] = {
            "baseUrl": context.base_url(APIS[options.api]),
            "api": options.api,
            "apiKey": context.api_key,
            "models": [{"id": context.model, "name": context.model}],
        }
        provider = deep_merge(provider, options.settings)
        agent_dir = f"{context.home}/.pi/agent"
        return HarnessLaunch(
            argv=["--print", "--no-session", "--mode", "json", "--provider", "polar", "--model", context.model],
            env={
                "PI_CODING_AGENT_DIR": agent_dir,
                "PI_OFFLINE": "1",
                "PI_SKIP_VERSION_CHECK": "1",
                "PI_TELEMETRY": "0",
            },
            files={
                ".pi/agent/models.json": dump_json({"providers": {"polar": provider}}),
                **skill_files(options.skills, ".pi/agent/skills"),
            },
            stdin=context.instruction.encode(),
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        ends = [event for event in json_lines(run.stdout) if event.get("type") == "agent_end"]
        if not ends:
            return "pi printed no agent_end event (it did not finish a turn)"
        messages = [m for m in ends[-1].get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant"]
        if not messages:
            return "pi finished without any assistant message"
        last = messages[-1]
        if last.get("stopReason") in ("error", "aborted"):
            return f"pi's last turn ended with {last.get('stopReason')}: {last.get('errorMessage') or 'no message'}"
        if not last.get("content"):
            return "pi ended with an empty assistant turn (exit 0): the model's answer could not be parsed"
        return None
