"""Optional packages: imported where a command needs them, never when a Polar module is imported, so a plain
``pip install polar-rl`` runs every command that needs none. A missing one is one line naming the extra that brings
it (``polar export needs pyarrow: pip install 'polar-rl[hf]'``)."""

from __future__ import annotations

import importlib
from types import ModuleType

from polar_cli.errors import MissingDependencyError

EXTRAS = {
    "pyarrow": "hf", "datasets": "hf", "huggingface_hub": "hf", "docker": "docker", "spython": "apptainer", "ray": "ray"
}  # fmt: skip
"""The import name of each optional package -> the ``polar-rl`` extra that installs it."""


def missing(package: str, *, needed_by: str, distribution: str = "polar-rl", extra: str | None = None,
            also: str = "") -> MissingDependencyError:  # fmt: skip
    """The error for ``package`` not being installed: ``<needed_by> needs <package>: pip install '<dist>[<extra>]'``
    (``extra``: default the one ``EXTRAS`` names; ``""`` or a package ``EXTRAS`` does not know: ``pip install
    <dist>``, a package of its own; ``also``: what else the user can do, appended)."""
    extra = EXTRAS.get(package, "") if extra is None else extra
    target = f"'{distribution}[{extra}]'" if extra else distribution
    return MissingDependencyError(f"{needed_by} needs {package}: pip install {target}{also}")


def require(module: str, *, needed_by: str, distribution: str = "polar-rl", extra: str | None = None,
            also: str = "") -> ModuleType:  # fmt: skip
    """``module`` (e.g. ``datasets``), imported; MissingDependencyError (see ``missing``) when its package is not
    installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.split(".")[0]
        raise missing(package, needed_by=needed_by, distribution=distribution, extra=extra, also=also) from exc
