"""Built-in CLI commands, registered through ``register_commands`` like any plugin's.

One module per command under :mod:`polar_cli.commands`, each exposing ``register(app)``, imported only when the CLI
is built. The order is the ``polar --help`` order: a user's path from one task to a dataset, then the service, then
the tools; this hook runs first, so plugins' commands follow the built-ins.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from polar_cli.hookspecs import hookimpl

if TYPE_CHECKING:
    import typer

COMMAND_MODULES: tuple[str, ...] = (
    "polar_cli.commands.run",
    "polar_cli.commands.generate",
    "polar_cli.commands.export",
    "polar_cli.commands.verify",
    "polar_cli.commands.view",
    "polar_cli.commands.replay",
    "polar_cli.commands.serve",
    "polar_cli.commands.submit",
    "polar_cli.commands.status",
    "polar_cli.commands.inference",
    "polar_cli.commands.proxy",
    "polar_cli.commands.doctor",
    "polar_cli.commands.harness",
    "polar_cli.commands.runtimes",
    "polar_cli.commands.plugins",
)


@hookimpl(tryfirst=True)
def register_commands(app: typer.Typer) -> None:
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
