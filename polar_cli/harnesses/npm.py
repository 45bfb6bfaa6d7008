"""The shared base of harnesses that ship as npm packages (codex, claude_code, pi, qwen_code, gemini_cli, opencode).

A subclass names its package, pinned version and binary; the base installs it into its Polar-managed prefix
(:mod:`polar_cli.harnesses.install`), mounts that prefix as the runtime's tools dir and resolves the binary there.
The subclass writes :meth:`NpmHarness.build` (argv tail, env, files); the base adds what every npm CLI needs
(:class:`polar_cli.harnesses.cli.CliHarness`, shared with the PyPI harnesses).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any, ClassVar

from polar_cli.harnesses import install as installer
from polar_cli.harnesses.cli import CliHarness, CliOptions
from polar_cli.interfaces.harness import HarnessContext

# Every npm CLI: no update prompts from npm-based self-updaters, no colours in captured output.
COMMON_ENV = {
    "NO_UPDATE_NOTIFIER": "1",
    "NO_COLOR": "1",
    "FORCE_COLOR": "0",
    "DO_NOT_TRACK": "1",
}


# Linux refuses one argv string or env value longer than 128 KiB (MAX_ARG_STRLEN); stay well below it.
ARG_LIMIT = 100_000


def prompt_flag(flag: str, instruction: str) -> tuple[list[str], bytes | None]:
    """``[flag=instruction]`` (``=`` keeps a leading ``-`` a value), or stdin for an instruction too long for argv."""
    if len(instruction.encode()) <= ARG_LIMIT:
        return [f"{flag}={instruction}"], None
    return [], instruction.encode()


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, merging nested dicts (user settings on top of the adapter's)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


NpmOptions = CliOptions
"""``AgentSpec.config`` of an npm harness (``settings``); an adapter with more options subclasses it."""


class NpmHarness(CliHarness):
    """A harness installed from npm at a pinned version into a Polar-managed prefix."""

    npm_package: ClassVar[str] = ""
    extra_packages: ClassVar[tuple[str, ...]] = ()
    allow_scripts: ClassVar[tuple[str, ...]] = ()
    common_env: ClassVar[Mapping[str, str]] = COMMON_ENV

    @property
    def npm(self) -> installer.NpmInstall:
        return installer.NpmInstall(
            name=self.name,
            package=self.npm_package,
            version=self.version,
            binary=self.binary,
            extra_packages=self.extra_packages,
            allow_scripts=self.allow_scripts,
        )

    @property
    def installation(self) -> installer.NpmInstall:
        return self.npm

    def install(self, *, force: bool = False) -> None:
        installer.install(self.npm, force=force)

    def executable(self, context: HarnessContext) -> str:
        """The CLI inside the runtime: in the mounted tools dir, else whatever PATH finds."""
        return posixpath.join(context.tools, "bin", self.binary) if context.tools else self.binary
