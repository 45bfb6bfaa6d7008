"""Polar's plugin hooks (pluggy project ``polar``).

Each ``register_*`` hook receives a ``register`` callable typed for its category; a plugin calls it once per
component instance (the registry checks the category, the name and that the name is unique). Hooks are always called
with keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import typer

    from polar_cli.interfaces import Builder, Dataset, Evaluator, Harness, InferenceBackend, Runtime

PROJECT = "polar"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

RegisterHarness = Callable[["Harness"], None]
RegisterRuntime = Callable[["Runtime"], None]
RegisterBuilder = Callable[["Builder"], None]
RegisterEvaluator = Callable[["Evaluator"], None]
RegisterDataset = Callable[["Dataset"], None]
RegisterBackend = Callable[["InferenceBackend"], None]


@hookspec
def register_harnesses(register: RegisterHarness) -> None:
    """Register :class:`~polar_cli.interfaces.Harness` instances."""


@hookspec
def register_runtimes(register: RegisterRuntime) -> None:
    """Register :class:`~polar_cli.interfaces.Runtime` instances."""


@hookspec
def register_builders(register: RegisterBuilder) -> None:
    """Register :class:`~polar_cli.interfaces.Builder` instances."""


@hookspec
def register_evaluators(register: RegisterEvaluator) -> None:
    """Register :class:`~polar_cli.interfaces.Evaluator` instances."""


@hookspec
def register_datasets(register: RegisterDataset) -> None:
    """Register :class:`~polar_cli.interfaces.Dataset` instances."""


@hookspec
def register_backends(register: RegisterBackend) -> None:
    """Register :class:`~polar_cli.interfaces.InferenceBackend` instances."""


@hookspec
def register_commands(app: typer.Typer) -> None:
    """Add commands or sub-apps to the ``polar`` typer app (``app.command()`` / ``app.add_typer``)."""
