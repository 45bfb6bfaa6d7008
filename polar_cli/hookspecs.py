"""Polar's plugin hooks (pluggy project ``polar``).

Each ``register_*`` hook receives a ``register`` callable; a plugin calls it once per component instance.
Hooks are always called with keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "polar"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[[Any], None]


@hookspec
def register_harnesses(register: Register) -> None:
    """Register :class:`~polar_cli.interfaces.Harness` instances."""


@hookspec
def register_runtimes(register: Register) -> None:
    """Register :class:`~polar_cli.interfaces.Runtime` instances."""


@hookspec
def register_builders(register: Register) -> None:
    """Register :class:`~polar_cli.interfaces.Builder` instances."""


@hookspec
def register_evaluators(register: Register) -> None:
    """Register :class:`~polar_cli.interfaces.Evaluator` instances."""


@hookspec
def register_datasets(register: Register) -> None:
    """Register :class:`~polar_cli.interfaces.Dataset` instances."""


@hookspec
def register_backends(register: Register) -> None:
    """Register :class:`~polar_cli.interfaces.InferenceBackend` instances."""


@hookspec
def register_commands(app: Any) -> None:
    """Add commands or sub-apps to the ``polar`` typer app (``app.command()`` / ``app.add_typer``)."""
