"""The Polar-managed prefixes harness CLIs are installed into (npm prefixes here; venvs in :mod:`.pypi`).

Each pinned CLI gets its own prefix ``${POLAR_HOME:-~/.cache/polar}/harnesses/<name>-<version>/``, laid out as an npm
global prefix (``bin/<cli>`` links into ``lib/node_modules``) plus a copy of ``node`` in ``bin/``, so the whole
directory can be mounted read-only into a container as the runtime's tools dir. A finished install carries a marker
file; installs build in a sibling directory and are renamed into place under a lock, so a crash or a concurrent
``polar harness install`` never leaves a half-installed prefix that looks complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polar_cli.errors import HarnessError, RuntimeFailure
from polar_cli.runtimes.tools import ensure_node

MARKER = ".polar-harness.json"
INSTALL_TIMEOUT = 1200.0


def polar_home() -> Path:
    """``$POLAR_HOME``, else ``~/.cache/polar``."""
    configured = os.environ.get("POLAR_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "polar"


def harness_root() -> Path:
    return polar_home() / "harnesses"


@dataclass(frozen=True)
class PinnedInstall:
    """One pinned CLI in its own prefix ``harnesses/<name>-<version>``: complete when its marker, ``bin/<binary>``
    and the runtime it needs (:attr:`runtime_binary`: npm's ``node``, a venv's ``python``) are all there."""

    name: str
    package: str
    version: str
    binary: str
    extra_packages: tuple[str, ...] = ()
    runtime_binary: ClassVar[str] = ""

    @property
    def prefix(self) -> Path:
        return harness_root() / f"{self.name}-{self.version}"

    @property
    def bin_path(self) -> Path:
        return self.prefix / "bin" / self.binary

    def is_installed(self) -> bool:
        bin_dir = self.prefix / "bin"
        return (self.prefix / MARKER).is_file() and self.bin_path.exists() and (bin_dir / self.runtime_binary).exists()

    def facts(self) -> dict[str, Any]:
        """What the marker file records of this install."""
        return {
            "name": self.name,
            "package": self.package,
            "version": self.version,
            "extra_packages": list(self.extra_packages),
            "binary": self.binary,
        }


@dataclass(frozen=True)
class NpmInstall(PinnedInstall):
    """One pinned npm install: the CLI package, packages it needs beside it, and whose install scripts may run."""

    allow_scripts: tuple[str, ...] = ()
    """npm >= 11 skips dependency install scripts unless allowed; some CLIs need theirs (native binary copies)."""
    runtime_binary: ClassVar[str] = "node"

    def specs(self) -> list[str]:
        return [f"{self.package}@{self.version}", *self.extra_packages]


def _tail(text: str, limit: int = 3000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def npm_command(prefix: Path, specs: Sequence[str], allow_scripts: Sequence[str]) -> list[str]:
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessError("npm was not found on PATH: install Node.js 20 or newer (with npm) to install harness CLIs")
    argv = [npm, "install", "--global", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]
    if allow_scripts:
        # npm >= 11 runs dependency install scripts only when allowed; older npm runs them all (and warns here)
        argv.append(f"--allow-scripts={','.join(allow_scripts)}")
    else:
        argv.append("--ignore-scripts")  # the same result on every npm version: CLIs that need none get none
    return [*argv, *specs]


def run_installer(argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None, timeout: float) -> None:
    """Run one install command (npm, pip, ...) to completion; raises HarnessError with its own message on failure."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise HarnessError(f"cannot run {argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise HarnessError(f"{what} failed (exit {done.returncode}): {_tail(done.stderr or done.stdout)}")


def managed_install(
    name: str,
    version: str,
    build: Callable[[Path], Mapping[str, Any]],
    *,
    is_installed: Callable[[], bool],
    force: bool = False,
) -> Path:
    """Install into ``harnesses/<name>-<version>`` unless it is complete already; returns that prefix.

    ``build(partial)`` fills a sibling directory and returns the facts for the marker (raising HarnessError on
    failure); under a lock the marker is written last and the directory renamed into place, so an interrupted or
    concurrent install never leaves a prefix that looks complete. ``build`` is told the partial directory only:
    anything that records its own path (a venv's scripts) must be told the final prefix by other means.
    """
    root = harness_root()
    prefix = root / f"{name}-{version}"
    with _locked(root / f".{name}-{version}.lock"):
        if is_installed() and not force:
            return prefix
        partial = root / f".{name}-{version}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        try:
            facts = dict(build(partial))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        marker = {**facts, "installed_at": time.time(), "install_seconds": round(time.monotonic() - started, 1)}
        (partial / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if prefix.exists():
            shutil.rmtree(prefix)
        os.replace(partial, prefix)
        return prefix


def install(spec: NpmInstall, *, force: bool = False, timeout: float = INSTALL_TIMEOUT) -> Path:
    """Install ``spec`` into its prefix unless it is there already; returns the prefix. Raises HarnessError."""

    def build(partial: Path) -> dict[str, Any]:
        argv = npm_command(partial, spec.specs(), spec.allow_scripts)
        # npm's own notices would only add noise (and network calls) to an unattended install
        env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}
        run_installer(argv, what=f"npm install {' '.join(spec.specs())}", env=env, timeout=timeout)
        if not (partial / "bin" / spec.binary).exists():
            raise HarnessError(f"npm installed {spec.package}@{spec.version} but it has no bin/{spec.binary}")
        try:
            node = ensure_node(partial)
        except RuntimeFailure as exc:
            raise HarnessError(str(exc)) from exc
        return {**spec.facts(), "node": str(node)}

    return managed_install(spec.name, spec.version, build, is_installed=spec.is_installed, force=force)
