"""The ``polar`` command: a thin typer app over the Python API."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import typer

from polar_cli import __version__
from polar_cli.errors import PolarError


def _version(value: bool) -> None:
    if value:
        typer.echo(f"polar {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    """The CLI: every ``register_commands``, the built-in commands' (``polar_cli.plugins.commands``) first."""
    app = typer.Typer(
        name="polar",
        help="Polar: agentic RL on any harness. Run unchanged agent CLIs through a token-capturing gateway.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )

    @app.callback()
    def root(
        version: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ) -> None:
        """Polar: agentic RL on any harness."""

    from polar_cli.registry import get_plugin_manager

    get_plugin_manager().hook.register_commands(app=app)
    return app


# What the libraries Polar loads would print on their own (tokenizer length notes, "PyTorch was not found", hub retry
# chatter) is not about the user's input: the CLI keeps it off the terminal unless the user asks for it.
QUIET_LIBRARIES = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "DATASETS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}


def quiet_libraries(debug: bool) -> None:
    """Silence third-party logging and Python warnings (``POLAR_DEBUG=1`` keeps them); a variable the user set wins."""
    if debug:
        return
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    warnings.simplefilter("ignore")
    warnings.filterwarnings("default", module=r"polar_cli\b")


def plain_flags() -> None:
    """Boolean flags read as flags in ``--help`` (``--wait``), without the ``<bool>`` type label typer gives them."""
    from typer.core import TyperOption

    show_type = getattr(TyperOption, "display_type_rich", None)
    if show_type is None or getattr(show_type, "polar_plain_flags", False):
        return  # a typer without type labels, or already done

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag and self.metavar is None:
            return None
        return show_type(self, ctx)

    display_type_rich.polar_plain_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def main() -> None:
    """Console-script entry point: PolarError becomes one line on stderr, not a traceback."""
    debug = os.environ.get("POLAR_DEBUG", "") not in ("", "0")
    quiet_libraries(debug)
    plain_flags()
    try:
        build_app()()
    except PolarError as exc:
        if debug:
            raise
        typer.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("Aborted.", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
