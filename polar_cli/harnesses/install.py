"""The Polar-managed npm prefixes harness CLIs are installed into.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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
class NpmInstall:
    """One pinned npm install: the CLI package, packages it needs beside it, and whose install scripts may run."""

    name: str
    package: str
    version: str
    binary: str
    extra_packages: tuple[str, ...] = ()
    allow_scripts: tuple[str, ...] = ()
    """npm >= 11 skips dependency install scripts unless allowed; some CLIs need theirs (native binary copies)."""

    @property
    def prefix(self) -> Path:
        return harness_root() / f"{self.name}-{self.version}"

    @property
    def bin_path(self) -> Path:
        return self.prefix / "bin" / self.binary

    def is_installed(self) -> bool:
        return (self.prefix / MARKER).is_file() and self.bin_path.exists() and (self.prefix / "bin" / "node").is_file()

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


def install(spec: NpmInstall, *, force: bool = False, timeout: float = INSTALL_TIMEOUT) -> Path:
    """Install ``spec`` into its prefix unless it is there already; returns the prefix. Raises HarnessError."""
    root = harness_root()
    with _locked(root / f".{spec.name}-{spec.version}.lock"):
        if spec.is_installed() and not force:
            return spec.prefix
        partial = root / f".{spec.name}-{spec.version}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        argv = npm_command(partial, spec.specs(), spec.allow_scripts)
        # npm's own notices would only add noise (and network calls) to an unattended install
        env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise HarnessError(f"npm install {' '.join(spec.specs())} timed out after {timeout:.0f} s") from exc
        except OSError as exc:
            raise HarnessError(f"cannot run npm: {exc}") from exc
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            detail = _tail(done.stderr or done.stdout)
            raise HarnessError(f"npm install {' '.join(spec.specs())} failed (exit {done.returncode}): {detail}")
        if not (partial / "bin" / spec.binary).exists():
            shutil.rmtree(partial, ignore_errors=True)
            raise HarnessError(f"npm installed {spec.package}@{spec.version} but it has no bin/{spec.binary}")
        try:
            node = ensure_node(partial)
        except RuntimeFailure as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise HarnessError(str(exc)) from exc
        marker = {
            "name": spec.name,
            "package": spec.package,
            "version": spec.version,
            "extra_packages": list(spec.extra_packages),
            "binary": spec.binary,
            "node": str(node),
            "installed_at": time.time(),
            "install_seconds": round(time.monotonic() - started, 1),
        }
        (partial / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if spec.prefix.exists():
            shutil.rmtree(spec.prefix)
        os.replace(partial, spec.prefix)
        return spec.prefix
