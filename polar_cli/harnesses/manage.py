"""Listing and installing registered harnesses (the library behind ``polar harness``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from polar_cli.errors import ConfigError
from polar_cli.harnesses.npm import NpmHarness
from polar_cli.harnesses.pypi import PypiHarness
from polar_cli.interfaces.harness import Harness
from polar_cli.registry import get_harness, get_registry


@dataclass(frozen=True)
class HarnessStatus:
    name: str
    package: str
    version: str
    installed: bool
    location: str

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "package": self.package,
            "version": self.version,
            "installed": self.installed,
            "location": self.location,
        }


def harness_status(harness: Harness) -> HarnessStatus:
    tools = harness.tools_dir()
    if isinstance(harness, NpmHarness):
        package = harness.npm_package
    elif isinstance(harness, PypiHarness):
        package = f"{harness.pypi_package} (PyPI)"
    else:
        package = "-"
    return HarnessStatus(harness.name, package, harness.version or "-", harness.is_installed(), str(tools or "-"))


def list_harnesses() -> list[HarnessStatus]:
    registry = get_registry()
    return [harness_status(get_harness(name)) for name in registry.names("harness")]


def install_harnesses(
    names: Sequence[str],
    *,
    every: bool = False,
    force: bool = False,
    progress: Callable[[str, str], None] | None = None,
) -> list[tuple[str, float]]:
    """Install the named harnesses (or all registered ones); returns (name, seconds) per harness. Idempotent."""
    if every and names:
        raise ConfigError("give harness names or --all, not both")
    if not every and not names:
        raise ConfigError("name a harness to install (or --all); `polar harness list` shows them")
    harnesses = [get_harness(name) for name in (get_registry().names("harness") if every else names)]
    done = []
    for harness in harnesses:
        if progress:
            state = "reinstalling" if force else ("present" if harness.is_installed() else "installing")
            progress(harness.name, state)
        started = time.monotonic()
        harness.install(force=force)
        done.append((harness.name, time.monotonic() - started))
    return done
