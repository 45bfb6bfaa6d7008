"""``polar plugins``: what is installed and which package provides it."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from polar_cli.commands.output import stdout_console
from polar_cli.registry import allowed_entry_points, get_registry, installed_entry_points


def list_components() -> list[dict[str, str]]:
    """One row per registered component: name, kind, plugin, package, version."""
    return [
        {
            "name": reg.name,
            "kind": reg.kind,
            "plugin": reg.source.plugin,
            "package": reg.source.package,
            "version": reg.source.version,
            "description": reg.component.description,
        }
        for reg in get_registry().registrations()
    ]


def list_disabled_plugins() -> list[dict[str, str]]:
    """Installed entry-point plugins left out by ``POLAR_LOAD_PLUGINS``."""
    allowed = allowed_entry_points()
    if allowed is None:
        return []
    rows = []
    for ep in installed_entry_points():
        if ep.name not in allowed:
            dist = getattr(ep, "dist", None)
            rows.append(
                {
                    "plugin": ep.name,
                    "package": dist.metadata["Name"] if dist else "unknown",
                    "version": dist.version if dist else "unknown",
                    "module": ep.value,
                }
            )
    return rows


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    show_all: bool = typer.Option(
        False, "--all", help="Also list installed plugins that POLAR_LOAD_PLUGINS leaves out."
    ),
) -> None:
    """List registered components (harnesses, runtimes, builders, evaluators, datasets, backends)."""
    components = list_components()
    disabled = list_disabled_plugins() if show_all else []
    if as_json:
        payload: object = {"components": components, "disabled": disabled} if show_all else components
        typer.echo(json.dumps(payload, indent=2))
        return
    table = Table("kind", "name", "package", "version", "description")
    for row in components:
        table.add_row(*(escape(str(row[k])) for k in ("kind", "name", "package", "version", "description")))
    console = stdout_console()
    console.print(table)
    if disabled:
        console.print("Installed but not loaded (POLAR_LOAD_PLUGINS):")
        for row in disabled:
            console.print(f"  {row['plugin']}: {row['package']} {row['version']} ({row['module']})")


def register(app: typer.Typer) -> None:
    app.command("plugins")(plugins)
