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

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from polar_cli.errors import ConfigError, HarnessError, RuntimeFailure
from polar_cli.harnesses.install import harness_root
from polar_cli.harnesses.npm import ARG_LIMIT
from polar_cli.interfaces.harness import Harness, HarnessContext, HarnessLaunch
from polar_cli.runtimes.tools import ensure_node

INSTRUCTION_FILE = ".polar/instruction.txt"
REFERENCE_AGENT = ".polar/reference_agent.mjs"
CONFIG_KEYS = {"command", "shell", "files"}


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

    def check_config(self, config: Mapping[str, Any]) -> None:
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"harness 'shell': unknown config {', '.join(unknown)} (known: command, files, shell)")
        command = config.get("command")
        if not (isinstance(command, str) and command.strip()) and not (
            isinstance(command, list) and command and all(isinstance(part, str) for part in command)
        ):
            raise ConfigError("harness 'shell': config.command must be a non-empty string or list of strings")
        if not isinstance(config.get("shell", "bash"), str):
            raise ConfigError("harness 'shell': config.shell must be the name or path of a shell")
        files = config.get("files", {})
        if not isinstance(files, Mapping) or not all(isinstance(v, str) for v in files.values()):
            raise ConfigError("harness 'shell': config.files must map paths (relative to the home) to text")

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        config: Mapping[str, Any] = context.config
        self.check_config(config)
        command = config["command"]
        argv = [str(config.get("shell", "bash")), "-c", command] if isinstance(command, str) else list(command)
        files = config.get("files", {})
        instruction_file = f"{context.home}/{INSTRUCTION_FILE}"
        env = {**gateway_env(context), "POLAR_INSTRUCTION_FILE": instruction_file}
        if len(context.instruction.encode()) <= ARG_LIMIT:
            env["POLAR_INSTRUCTION"] = context.instruction
        return HarnessLaunch(
            argv=argv,
            env=env,
            files={**{str(k): v for k, v in files.items()}, INSTRUCTION_FILE: context.instruction},
            cwd=context.workdir,
        )

    def doctor_config(self) -> dict[str, Any]:
        return {"command": f'exec node "$HOME/{REFERENCE_AGENT}"', "files": {REFERENCE_AGENT: reference_agent_source()}}
