"""Harnesses that ship as PyPI packages (mini-swe-agent, aider): one isolated venv per harness.

Each pinned CLI gets its own venv, ``${POLAR_HOME:-~/.cache/polar}/harnesses/<name>-<version>/`` (``bin/<cli>``,
``bin/python``), made with the Python that runs Polar (``python -m venv``, then that venv's pip installs
``<package>==<version>``). Like the npm installs (:func:`polar_cli.harnesses.install.managed_install`) it is built in a
sibling directory and renamed into place under a lock, its marker file written last; the venv's scripts name their
interpreter by absolute path, so the build's own path is rewritten to the final one before the rename. pip's own cache
makes a reinstall fast.

A venv is not relocatable: its ``bin/python`` points at the host's Python and its scripts at the host path of the
venv. So a PyPI harness runs in the **local runtime only**; in a container (the tools dir mounted at
``/polar/tools``) the adapter refuses with a clear error rather than start a CLI whose interpreter is missing.
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polar_cli.errors import HarnessError
from polar_cli.harnesses.cli import CliHarness
from polar_cli.harnesses.install import INSTALL_TIMEOUT, PinnedInstall, managed_install, run_installer
from polar_cli.interfaces.harness import HarnessContext

# Every Python CLI: unbuffered output, no user site-packages leaking into the venv, no bytecode written into the
# (possibly shared, read-only) venv, no colours in captured output.
COMMON_ENV = {
    "PYTHONUNBUFFERED": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class VenvInstall(PinnedInstall):
    """One pinned PyPI install: the CLI's package (``==version``) and packages it needs beside it, in a venv."""

    runtime_binary: ClassVar[str] = "python"

    def specs(self) -> list[str]:
        return [f"{self.package}=={self.version}", *self.extra_packages]


def relocate_scripts(partial: Path, prefix: Path) -> int:
    """Point the venv's scripts (``#!<partial>/bin/python``, ``activate``) and ``pyvenv.cfg`` at ``prefix``."""
    old, new = str(partial).encode(), str(prefix).encode()
    changed = 0
    for path in [*(partial / "bin").iterdir(), partial / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))
            changed += 1
    return changed


def install(spec: VenvInstall, *, force: bool = False, timeout: float = INSTALL_TIMEOUT) -> Path:
    """Install ``spec`` into its own venv unless it is there already; returns the prefix. Raises HarnessError."""

    def build(partial: Path) -> dict[str, Any]:
        python = sys.executable
        venv = [python, "-m", "venv", "--prompt", f"{spec.name}-{spec.version}", str(partial)]
        run_installer(venv, what=f"python -m venv {partial}", timeout=timeout)
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"}
        env.pop("PYTHONPATH", None)  # Polar's own sources must not shadow what the venv resolves
        argv = [str(partial / "bin" / "python"), "-m", "pip", "install", "--quiet", *spec.specs()]
        run_installer(argv, what=f"pip install {' '.join(spec.specs())}", env=env, timeout=timeout)
        if not (partial / "bin" / spec.binary).exists():
            raise HarnessError(f"pip installed {spec.package}=={spec.version} but it has no bin/{spec.binary}")
        relocate_scripts(partial, spec.prefix)
        return {
            **spec.facts(),
            "python": python,
            "python_version": ".".join(map(str, sys.version_info[:3])),
        }

    return managed_install(spec.name, spec.version, build, is_installed=spec.is_installed, force=force)


class PypiHarness(CliHarness):
    """A harness installed from PyPI at a pinned version into its own Polar-managed venv (local runtime only)."""

    pypi_package: ClassVar[str] = ""
    extra_packages: ClassVar[tuple[str, ...]] = ()
    common_env: ClassVar[Mapping[str, str]] = COMMON_ENV

    @property
    def venv(self) -> VenvInstall:
        return VenvInstall(
            name=self.name,
            package=self.pypi_package,
            version=self.version,
            binary=self.binary,
            extra_packages=self.extra_packages,
        )

    @property
    def installation(self) -> VenvInstall:
        return self.venv

    def install(self, *, force: bool = False) -> None:
        install(self.venv, force=force)

    def executable(self, context: HarnessContext) -> list[str]:
        """The CLI in its venv, which must be the host path itself (the local runtime); a container is refused."""
        prefix = str(self.venv.prefix)
        if context.tools is None or context.tools.rstrip("/") != prefix:
            where = context.tools or "no tools dir"
            raise HarnessError(
                f"harness {self.name!r} runs only in the local runtime: its venv ({prefix}) names the host's Python "
                f"by host path and cannot run from {where} (use runtime.backend: local)"
            )
        return [posixpath.join(prefix, "bin", self.binary)]
