"""The shared base of harnesses whose pinned CLI Polar installs into its own prefix (npm and PyPI packages).

A subclass says how its CLI is installed (:attr:`CliHarness.installation`: an npm prefix or a venv, each with its
``prefix`` and ``is_installed``) and writes :meth:`CliHarness.build` (argv tail, env, files); the base mounts the
prefix as the runtime's tools dir, resolves the binary and adds what every such CLI needs (``HOME``, no colours).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, Field

from polar_cli.interfaces.harness import Harness, HarnessContext, HarnessLaunch
from polar_cli.models import StrictModel


class Installation(Protocol):
    """Where a pinned CLI lives and whether it is complete there."""

    @property
    def prefix(self) -> Path: ...

    def is_installed(self) -> bool: ...


class CliOptions(StrictModel):
    """``AgentSpec.config`` of an installed CLI; an adapter with more options subclasses it."""

    settings: dict[str, Any] = Field(default_factory=dict, description="merged over the adapter's own config file")


class CliHarness(Harness):
    """A harness whose pinned CLI is installed into a Polar-managed prefix (its tools dir)."""

    binary: ClassVar[str] = ""
    options: ClassVar[type[BaseModel]] = CliOptions
    common_env: ClassVar[Mapping[str, str]] = {}
    """Variables every CLI of this kind gets (under the adapter's own)."""

    @property
    @abstractmethod
    def installation(self) -> Installation:
        """The pinned install of this CLI."""

    def is_installed(self) -> bool:
        return self.installation.is_installed()

    def tools_dir(self) -> Path | None:
        return self.installation.prefix

    @abstractmethod
    def executable(self, context: HarnessContext) -> list[str]:
        """The CLI as the runtime starts it: its path, or an interpreter and its entry script."""

    def settings(self, context: HarnessContext) -> Mapping[str, Any]:
        """The user's ``config.settings``, to merge over the adapter's own config file."""
        options: CliOptions = self.parse_config(context.config)
        return options.settings

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        launch = self.build(context)
        launch.argv = [*self.executable(context), *launch.argv]
        launch.env = {**self.common_env, "HOME": context.home, **launch.env}
        if launch.cwd is None:
            launch.cwd = context.workdir
        return launch

    @abstractmethod
    def build(self, context: HarnessContext) -> HarnessLaunch:
        """argv after the binary, env, files and stdin for this CLI."""
