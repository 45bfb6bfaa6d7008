"""Grok CLI (``@vibe-kit/grok-cli``): OpenAI Chat Completions through the ``openai`` SDK, headless with ``--prompt``.

``GROK_BASE_URL``, ``GROK_API_KEY`` and ``GROK_MODEL`` (and ``--model``) point it at the session; its user settings,
``<home>/.grok/user-settings.json``, say the same (else it writes its defaults there, with xAI's URL). It has no
telemetry or update check. In headless mode (``--prompt``) every tool runs without asking and it makes plain,
non-streamed calls. The instruction is one ``--prompt=<text>`` argument (it reads no stdin, so an instruction longer
than 100 kB is refused); ``--max-tool-rounds`` bounds its loop. It prints the conversation as JSON lines; an API
error becomes a last assistant line ``Sorry, I encountered an error: ...`` with exit 0, which ``check_run`` catches.

Known: it creates its project settings ``.grok/settings.json`` (``{"model": "grok-code-fast-1"}``, unused when
``--model`` is given) in its working directory on first run. Config: ``settings`` (merged into user-settings.json),
``max_tool_rounds``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.harnesses.npm import NpmHarness, NpmOptions, argv_instruction, deep_merge, dump_json
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun, json_lines

ERROR_PREFIX = "Sorry, I encountered an error:"


class GrokCliOptions(NpmOptions):
    """``AgentSpec.config`` of ``grok_cli``."""

    max_tool_rounds: int = Field(default=400, ge=1, description="the most tool rounds it runs (its --max-tool-rounds)")


class GrokCliHarness(NpmHarness):
    name: ClassVar[str] = "grok_cli"
    description: ClassVar[str] = "Grok CLI (@vibe-kit/grok-cli), OpenAI chat (not streamed)"
    npm_package: ClassVar[str] = "@vibe-kit/grok-cli"
    version: ClassVar[str] = "0.0.34"
    binary: ClassVar[str] = "grok"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("bash", "command")
    options: ClassVar[type[BaseModel]] = GrokCliOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: GrokCliOptions = self.parse_config(context.config)
        base_url = context.base_url("openai")
        settings: dict[str, Any] = {
            "apiKey": context.api_key,
            "baseURL": base_url,
            "defaultModel": context.model,
            "models": [context.model],
            "settingsVersion": 2,
        }
        settings = deep_merge(settings, options.settings)
        argv = [f"--prompt={argv_instruction(self.name, context.instruction)}", "--model", context.model,
                "--max-tool-rounds", str(options.max_tool_rounds)]  # fmt: skip
        return HarnessLaunch(
            argv=argv,
            env={"GROK_BASE_URL": base_url, "GROK_API_KEY": context.api_key, "GROK_MODEL": context.model},
            files={".grok/user-settings.json": dump_json(settings)},
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        messages = [m for m in json_lines(run.stdout) if m.get("role") == "assistant"]
        if not messages:
            return "grok printed no assistant message"
        last = messages[-1].get("content")
        if isinstance(last, str) and last.startswith(ERROR_PREFIX):
            return f"grok reported an error: {last[len(ERROR_PREFIX) :].strip()}"
        return None
