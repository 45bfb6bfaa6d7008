"""``polar runtimes gc``: remove by hand what crashed gateways' runtimes left behind (``polar_cli.runtimes.gc``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from polar_cli.commands.output import emit_json, stderr_console, stdout_console
from polar_cli.runtimes.gc import GcRule, Removal, collect_garbage
from polar_cli.runtimes.scratch import default_scratch_root

runtimes_app = typer.Typer(help="Runtime housekeeping: what crashed gateways left behind.")


def _row(removal: Removal, now: float) -> dict[str, Any]:
    item = removal.leftover
    return {"runtime": item.runtime, "kind": item.kind, "name": item.name, "node_id": item.node_id,
            "session_id": item.session_id, "age_s": round(max(0.0, now - item.created), 1),
            "reason": removal.reason, "error": removal.error}  # fmt: skip


@runtimes_app.command("gc")
def gc_command(
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed; remove nothing."),
    node: str | None = typer.Option(None, "--node", help="Only things labelled with this gateway node id."),
    ttl: float | None = typer.Option(None, "--ttl", min=0, help="Only things made at least this many seconds ago."),
    runtime: Annotated[
        list[str] | None, typer.Option("--runtime", help="Only this runtime (repeatable; default: every one).")
    ] = None,
    scratch_root: Annotated[
        Path | None,
        typer.Option("--scratch-root", help="Where the sessions' host dirs are (a gateway's scratch_root)."),
    ] = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Remove the containers, scratch dirs and processes of sessions whose maker process is gone.

    Never touched: what a live process made, anything of a node that still has a live gateway, anything made on
    another host. Exit 1 when something could not be removed."""
    rule = GcRule(node_id=node, older_than_s=ttl, spare_live_nodes=True)
    report = asyncio.run(collect_garbage(rule, runtimes=runtime, scratch_root=scratch_root, dry_run=dry_run))
    now = time.time()
    notes = stderr_console()
    if as_json:
        emit_json({"dry_run": dry_run, "removed": [_row(r, now) for r in report.removed],
                   "failed": [_row(r, now) for r in report.failed], "skipped": report.skipped})  # fmt: skip
    else:
        title = "would remove" if dry_run else "removed"
        table = Table("runtime", "kind", "name", "node", "session", "age (s)", "why", title=title)
        for removal in report.removed:
            row = _row(removal, now)
            table.add_row(*(escape(str(row[key] or "")) for key in ("runtime", "kind", "name", "node_id",
                                                                     "session_id", "age_s", "reason")))  # fmt: skip
        stdout_console().print(table)
        if not report.removed:
            where = scratch_root or default_scratch_root()
            notes.print(f"nothing to remove (scratch dirs looked for in {escape(str(where))})")
        for removal in report.failed:
            notes.print(f"could not remove {removal.leftover.kind} {escape(removal.leftover.name)}: "
                        f"{escape(removal.error or '')}")  # fmt: skip
        for name, why in report.skipped.items():
            notes.print(f"{name}: not looked at: {escape(why)}")
    if report.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(runtimes_app, name="runtimes")
