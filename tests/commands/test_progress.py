"""The progress helper of long commands: a live bar on a terminal, plain lines (about one per tenth) otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from polar_cli.commands.output import steps


def test_plain_lines_when_not_a_terminal_at_most_one_per_tenth() -> None:
    out = io.StringIO()
    with steps("polar export", Console(file=out, width=200)) as progress:
        progress.step("reading x")
        progress.step("reading x")  # the same step again: no new line
        for done in range(101):
            progress.step("writing 100 sessions", done, 100)
        progress.step("done")
    lines = out.getvalue().splitlines()
    assert lines[0] == "polar export: reading x" and lines[-1] == "polar export: done"
    assert lines[1:-1] == [f"polar export: writing 100 sessions ({n}/100)" for n in range(0, 101, 10)]


def test_a_live_bar_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    with steps("polar push-hub", console) as progress:
        progress.step("uploading 2 files", 1, 2)
    shown = out.getvalue()
    assert "polar push-hub" in shown and "uploading 2 files" in shown and "1/2" in shown
