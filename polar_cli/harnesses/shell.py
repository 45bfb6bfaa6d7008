"""The ``shell`` harness: any command, given the session's gateway and the instruction safely.

``config.command`` is either an argv list (run as is) or a string run by ``bash -c`` (``config.shell`` picks another
shell). The instruction is never put into the command: it is in the file ``$POLAR_INSTRUCTION_FILE`` (in the session
home) and, when shorter than 100 kB, in the variable ``$POLAR_INSTRUCTION``. Write ``"$POLAR_INSTRUCTION"`` (quoted) in
a command string: the shell expands a variable once and never re-parses its value, so quotes, ``$(...)``, backticks
and newlines in the instruction run nothing.

Every command also sees ``POLAR_MODEL``, ``POLAR_API_KEY``, ``POLAR_<FAMILY>_BASE_URL`` and the variables the usual
SDKs read (``OPENAI_BASE_URL``/``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``,
``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``). ``config.files`` (path relative to the home -> text) are written
first, e.g. a small agent script. Its doctor run uses Polar's reference agent (``reference_agent.mjs``, Node).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, field_validator

from polar_cli.errors import HarnessError, RuntimeFailure
from polar_cli.harnesses.install import harness_root
from polar_cli.harnesses.npm import ARG_LIMIT
from polar_cli.interfaces.harness import Harness, HarnessContext, HarnessLaunch
from polar_cli.models import StrictModel
from polar_cli.runtimes.tools import ensure_node

INSTRUCTION_FILE = ".polar/instruction.txt"
REFERENCE_AGENT = ".polar/reference_agent.mjs"


class ShellOptions(StrictModel):
    """``AgentSpec.config`` of ``shell``."""

    command: str | list[str] = Field(default="", validate_default=True, description="argv list, or a shell string")
    shell: str = Field(default="bash", description="the shell that runs a command string (name or path)")
    files: dict[str, str] = Field(default_factory=dict, description="path (relative to the home) -> text")

    @field_validator("command", mode="before")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if (isinstance(value, str) and value.strip()) or (
            isinstance(value, list) and value and all(isinstance(part, str) for part in value)
        ):
            return value
        raise ValueError("must be a non-empty string or list of strings")


def reference_agent_source() -> str:
    return resources.files("polar_cli.harnesses").joinpath("reference_agent.mjs").read_text(encoding="utf-8")


def gateway_env(context: HarnessContext) -> dict[str, str]:
    """The session's model endpoint under Polar's names and the names common SDKs read."""
    env = {"POLAR_MODEL": context.model, "POLAR_API_KEY": context.api_key}
    sdk_names = {
        "openai": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
        "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
        "google": ("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY"),
    }
    for family in context.base_urls:
        url = context.base_url(family)
        env[f"POLAR_{family.upper()}_BASE_URL"] = url
        if family in sdk_names:
            url_var, key_var = sdk_names[family]
            env[url_var] = url
            env[key_var] = context.api_key
    return env


class ShellHarness(Harness):
    name: ClassVar[str] = "shell"
    description: ClassVar[str] = "any command (argv, or a bash string); the instruction via $POLAR_INSTRUCTION(_FILE)"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("bash", "command")
    options: ClassVar[type[BaseModel]] = ShellOptions

    def tools_dir(self) -> Path | None:
        """A tools dir holding just ``bin/node``, so commands (and the reference agent) have Node in any image."""
        return harness_root() / "shell-tools"

    def is_installed(self) -> bool:
        return (harness_root() / "shell-tools" / "bin" / "node").is_file()

    def install(self, *, force: bool = False) -> None:
        try:
            ensure_node(harness_root() / "shell-tools")
        except RuntimeFailure as exc:
            raise HarnessError(f"harness 'shell': {exc}") from exc

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        options: ShellOptions = self.parse_config(context.config)
        command = options.command
        argv = [options.shell, "-c", command] if isinstance(command, str) else list(command)
        instruction_file = f"{context.home}/{INSTRUCTION_FILE}"
        env = {**gateway_env(context), "POLAR_INSTRUCTION_FILE": instruction_file}
        if len(context.instruction.encode()) <= ARG_LIMIT:
            env["POLAR_INSTRUCTION"] = context.instruction
        return HarnessLaunch(
            argv=argv,
            env=env,
            files={**options.files, INSTRUCTION_FILE: context.instruction},
            cwd=context.workdir,
        )

    def doctor_config(self) -> dict[str, Any]:
        return {"command": f'exec node "$HOME/{REFERENCE_AGENT}"', "files": {REFERENCE_AGENT: reference_agent_source()}}
