"""Harness interface: how one agent CLI is installed, configured, launched and judged.

A :class:`Harness` (a registered plugin) never runs anything itself. For one session it turns a
:class:`HarnessContext` (instruction, served model, the session's gateway base URLs and key, and the paths the runtime
gives it) into a :class:`HarnessLaunch`: an argv list (never a shell string), environment variables, config files to
write into the session's own home, and the bytes for stdin (usually none: stdin is closed). After the run,
:meth:`Harness.check_run` says whether the run failed even if the CLI exited 0 (pi's empty turn).

``polar doctor --harness NAME`` is the test of an adapter: :meth:`Harness.doctor_script` supplies the scripted
assistant turns (one call of the harness's own shell tool, then a final answer) that the proxy replays.

After a run, the builders ask :meth:`Harness.chain_role` about the first call of each chain: an adapter knows the calls
its harness makes for itself (a title, a memory agent) by their shape, and calls them ``side`` (docs/builders.md,
"Chain roles").
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from polar_cli.errors import HarnessError
from polar_cli.interfaces.base import Component
from polar_cli.models import ChainRole, Completion
from polar_cli.models.base import describe_config_keys_error


@dataclass(frozen=True)
class HarnessContext:
    """Everything an adapter needs to configure one session's run.

    Paths are as the harness sees them inside its runtime: ``home`` is the session's private HOME (config goes only
    there), ``workdir`` where the agent works, ``tools`` the mounted tools dir (node and the Polar-managed npm prefix),
    or ``None``. ``base_urls`` maps a provider family (``openai``, ``anthropic``, ``google``) to the session's base
    URL for it (``.../s/{id}/v1`` for openai, ``.../s/{id}`` for the other two).
    """

    instruction: str
    model: str
    api_key: str
    base_urls: Mapping[str, str]
    home: str
    workdir: str
    tools: str | None = None
    session_id: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)
    """``AgentSpec.config``: the adapter's own options (its ``options`` model; ``Harness.parse_config`` reads them)."""

    def base_url(self, family: str) -> str:
        try:
            return self.base_urls[family].rstrip("/")
        except KeyError:
            raise HarnessError(f"the session has no {family!r} base URL (has: {', '.join(self.base_urls)})") from None


@dataclass
class HarnessLaunch:
    """How to start the harness: argv, env, files (paths relative to the session home), cwd and stdin."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None
    """Bytes fed to stdin, then EOF; ``None`` closes stdin at once. Never a terminal: CLIs must not wait for input."""


@dataclass(frozen=True)
class HarnessRun:
    """How one harness run ended; ``failure`` is set when it failed (with the harness's own stderr kept)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (harnesses that print JSON events mix in other lines sometimes)."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                events.append(value)
    return events


@dataclass(frozen=True)
class RoleVerdict:
    """A chain's role and the evidence it was decided on, in words (``Trace.role`` and ``Trace.role_reason``)."""

    role: ChainRole
    reason: str


def system_prompt(completion: Completion) -> str:
    """The text of the system messages that open ``completion``'s request (text parts joined), or ``""``."""
    texts = []
    for message in completion.request_messages:
        if message.get("role") != "system":
            break
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        texts.append(content if isinstance(content, str) else "")
    return "\n".join(texts)


class Harness(Component):
    """An agent harness run unchanged (Codex CLI, Claude Code, pi, a shell command, ...)."""

    kind: ClassVar[str] = "harness"
    provider: ClassVar[str] = "openai"
    """The provider family whose base URL the harness talks to (``openai``, ``anthropic``, ``google``)."""
    version: ClassVar[str] = ""
    """The pinned version of the CLI (empty when the harness installs nothing)."""
    shell_tool: ClassVar[tuple[str, str]] = ("bash", "command")
    """The harness's own shell tool: (tool name, name of its command argument), used by :meth:`doctor_script`."""
    shell_tool_extra: ClassVar[Mapping[str, Any]] = {}
    """Further arguments that tool requires (e.g. a description)."""
    side_prompts: ClassVar[Mapping[str, str]] = {}
    """The calls the harness makes for itself, known by their system prompt: a text that prompt contains -> what the
    call is (``"a session title call"``). See :meth:`chain_role`."""

    def is_installed(self) -> bool:
        """Whether :meth:`install` has nothing left to do."""
        return True

    def install(self, *, force: bool = False) -> None:
        """Install the pinned CLI into the Polar-managed prefix (idempotent; ``force`` reinstalls)."""

    def tools_dir(self) -> Path | None:
        """The host directory the runtime mounts read-only as the tools dir (its ``bin`` first on PATH), if any."""
        return None

    def describe_config_error(self, exc: ValidationError) -> str:
        """In the words of ``agent.config`` keys: ``unknown config x (known: settings)``, ``config api must be ...``."""
        return describe_config_keys_error(exc, self.options)

    @abstractmethod
    def launch(self, context: HarnessContext) -> HarnessLaunch:
        """Describe how to start the harness for one session (argv, env, files for its home, stdin)."""

    def check_run(self, run: HarnessRun) -> str | None:
        """Why this run failed, or ``None``. The base rule: a timeout or a non-zero exit is a failure."""
        if run.timed_out:
            return f"{self.name} timed out after {run.seconds:.0f} s"
        if run.exit_code != 0:
            return f"{self.name} exited with status {run.exit_code}"
        return None

    def chain_role(self, first: Completion) -> RoleVerdict | None:
        """The role of the chain whose first call is ``first``, when the harness knows that call by its shape; None
        leaves the role to the builder's rule (docs/builders.md, "Chain roles"). By default: ``side`` when the call's
        system prompt contains one of :attr:`side_prompts`. Override for evidence a system prompt does not carry."""
        system = system_prompt(first)
        for marker, what in self.side_prompts.items():
            if marker in system:
                return RoleVerdict("side", f"{self.name}: {what} (its system prompt)")
        return None

    def doctor_script(self, command: str) -> list[dict[str, Any]]:
        """The assistant turns ``polar doctor`` replays: one shell-tool call running ``command``, then an answer.

        OpenAI-style assistant messages (the scripted backend's format), in this harness's own tool schema.
        """
        name, argument = self.shell_tool
        arguments = {argument: command, **self.shell_tool_extra}
        call = {
            "id": "call_polar_doctor_1",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "assistant", "content": "The file is written. Polar doctor: done."},
        ]

    def doctor_config(self) -> dict[str, Any]:
        """``AgentSpec.config`` for a doctor run (the ``shell`` harness supplies its reference agent here)."""
        return {}
