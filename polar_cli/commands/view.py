"""``polar view PATH [--out FILE] [--serve]`` (or ``--server URL --task ID`` instead of PATH): sessions as one
self-contained HTML page (docs/view.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polar_cli.commands import sources
from polar_cli.commands.interrupt import Interrupted, stop_on_signals
from polar_cli.commands.output import OverwriteOption, refuse_existing
from polar_cli.commands.sources import ONLINE_HELP, ServerOption, SinceOption, TaskOption, TokenOption
from polar_cli.inputs import ServerTasks, Source
from polar_cli.view import ViewServer, load_view, render_html


def default_out(source: Source) -> Path:
    """``results.jsonl`` -> ``./results.html``; a folder ``rollouts/`` -> ``./rollouts.html`` (never inside the
    folder: an exported dataset folder is what gets pushed to the hub); tasks on a server -> ``./<first task>.html``
    (``./tasks.html`` for ``--since`` alone)."""
    if isinstance(source, ServerTasks):
        return Path((source.task_ids[0] if source.task_ids else "tasks").replace("/", "_") + ".html")
    name = source.resolve().name
    return Path((name.rsplit(".", 1)[0] if source.is_file() else name) + ".html")


SOURCE_HELP = f"A polar run --out results file (JSONL), a polar generate folder, an exported dataset, {ONLINE_HELP}."
OUT_HELP = "The HTML file to write (default: ./<name>.html; with --serve, none unless given); see --overwrite."
TOKENIZER_HELP = "HF tokenizer (folder or hub id): the text of prompt tokens and of tokens recorded without text."


def view_command(
    path: Annotated[Path | None, typer.Argument(help=SOURCE_HELP, metavar="PATH", show_default=False)] = None,
    server: ServerOption = None,
    token: TokenOption = None,
    task: TaskOption = None,
    since: SinceOption = None,
    out: Annotated[Path | None, typer.Option("--out", help=OUT_HELP)] = None,
    serve: bool = typer.Option(False, "--serve", help="Serve the page on 127.0.0.1 (read-only) until stopped."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port for --serve (0: a free one)."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help=TOKENIZER_HELP),
    title: str | None = typer.Option(None, "--title", help="The page title."),
    overwrite: bool = OverwriteOption,
) -> None:
    """Open results in the browser: a session list, and each session's chains as token streams with their loss mask,
    logprobs, messages and evaluator report."""
    source = sources.source(path, server, token, task, since)
    target = out or (None if serve else default_out(source))
    if target is not None:
        refuse_existing(target, overwrite, "--out" if out is not None else "the page")
    loaded = None
    if tokenizer is not None:
        from polar_cli.proxy import load_tokenizer

        loaded = load_tokenizer(tokenizer)
    view = load_view(source, tokenizer=loaded)
    page = render_html(view, title=title).encode()
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(page)
        typer.echo(f"{len(view.sessions)} sessions -> {target} (open file://{target.resolve()})")
    if serve:
        http = ViewServer(page, port=port)
        typer.echo(f"serving {len(view.sessions)} sessions at {http.url} (read-only, Ctrl-C or SIGTERM stops)")
        try:
            with stop_on_signals():  # the signal interrupts serve_forever's wait at once (its poll is 0.5 s)
                http.serve_forever()
        except Interrupted as stop:
            typer.echo(f"stopped ({stop.name}); no longer serving {http.url}", err=True)
            raise typer.Exit(stop.exit_code) from None
        finally:
            http.server_close()


def register(app: typer.Typer) -> None:
    app.command("view")(view_command)
