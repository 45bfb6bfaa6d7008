"""The gptme harness (PyPI ``gptme``): OpenAI Chat Completions (streamed) through its ``local`` provider.

gptme runs headless and unchanged: ``--non-interactive`` (no prompt, every confirmation answered yes; the run ends
when the model calls gptme's ``complete`` tool), ``--model local/<served model>``
with ``OPENAI_BASE_URL`` at the session and the key in ``OPENAI_API_KEY``. The instruction is one argument after
``--``: gptme's end of options, which also turns off its shortcuts (``gptme search ...``, ``gptme <util command>``,
``gptme-<plugin>`` dispatch), so it reaches the model verbatim as the first user message.

gptme's tools are its own (``shell``, ``save``, ``patch``, ``ipython``, ...) in the tool format it picks for the model:
for a ``local/...`` model that is ``tool``, native tool calls (``shell`` with a ``command`` argument); after each call
it sends the output back; an answer without a tool call gets a reminder to call ``complete``, and another call.
The conversation's config is written ahead (named, so gptme makes no model call to title it; its workspace the work
dir). ``config.tool_format: markdown`` (or
``xml``) makes the model write its calls as fenced blocks in the text instead. Its config (``~/.config/gptme``), logs
and conversation (``~/.local/share/gptme``) go to the session home, as HOME points there.

Offline: the ``local`` provider has no model list to fetch; ``GPTME_TIKTOKEN_TIMEOUT=0`` keeps gptme from
downloading tiktoken's encoding (it counts tokens by characters instead); telemetry is off
(``GPTME_TELEMETRY_ENABLED=false``, and it needs an extra that is not installed); gptme has no update check.

A model call that fails for good (after gptme's own retries of transient errors) ends the run with status 1.

Config: ``tool_format`` (``markdown``, ``xml``, ``tool``), ``tools`` (gptme's ``--tools`` allowlist), ``settings``
(written as gptme's user config, ``~/.config/gptme/config.toml``, instead of the default one it creates).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.harnesses import toml
from polar_cli.harnesses.cli import CliOptions
from polar_cli.harnesses.pypi import PypiHarness
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch

CONFIG_FILE = ".config/gptme/config.toml"
CONVERSATION = "polar"
# the conversation's own config: named (gptme then makes no call to title it), its workspace the work dir
CHAT_CONFIG_FILE = f".local/share/gptme/logs/{CONVERSATION}/config.toml"


class GptmeOptions(CliOptions):
    """``AgentSpec.config`` of ``gptme``."""

    tool_format: str | None = Field(default=None, description="gptme's --tool-format (markdown, xml, tool)")
    tools: str | None = Field(default=None, description="gptme's --tools allowlist (e.g. 'shell,save,patch')")


class GptmeHarness(PypiHarness):
    """gptme (``gptme`` on PyPI): its own tools, OpenAI chat through its local provider."""

    name: ClassVar[str] = "gptme"
    description: ClassVar[str] = "gptme (PyPI gptme), streamed OpenAI chat via its local provider"
    pypi_package: ClassVar[str] = "gptme"
    version: ClassVar[str] = "0.35.1"
    binary: ClassVar[str] = "gptme"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("shell", "command")
    options: ClassVar[type[BaseModel]] = GptmeOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: GptmeOptions = self.parse_config(context.config)
        argv = ["--non-interactive", "--model", f"local/{context.model}", "--name", CONVERSATION]
        if options.tool_format:
            argv += ["--tool-format", options.tool_format]
        if options.tools:
            argv += ["--tools", options.tools]
        settings = self.settings(context)
        files = {CHAT_CONFIG_FILE: toml.dumps({"chat": {"name": CONVERSATION, "workspace": context.workdir}})}
        if settings:
            files[CONFIG_FILE] = toml.dumps(settings)
        return HarnessLaunch(
            argv=[*argv, "--", context.instruction],
            files=files,
            env={
                "OPENAI_BASE_URL": context.base_url("openai"),
                "OPENAI_API_KEY": context.api_key,
                "GPTME_TELEMETRY_ENABLED": "false",
                "GPTME_TIKTOKEN_TIMEOUT": "0",
            },
        )

    def doctor_script(self, command: str) -> list[dict[str, Any]]:
        """The shell call, then gptme's own way to end a non-interactive run: the answer with a ``complete`` call (an
        answer without a tool call gets a reminder to call it)."""
        first, _ = super().doctor_script(command)
        complete = {
            "id": "call_polar_doctor_2",
            "type": "function",
            "function": {"name": "complete", "arguments": json.dumps({})},
        }
        return [
            first,
            {"role": "assistant", "content": "The file is written. Polar doctor: done.", "tool_calls": [complete]},
        ]
