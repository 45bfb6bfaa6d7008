"""``polar replay SOURCE [--out script.yaml]``: a recorded session as a scripted-backend script; ``--check OTHER``:
where a replayed run's requests first differ from the original's (docs/scripted-backend.md, "Replaying a session")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml

from polar_cli.commands.output import OverwriteOption, refuse_existing, stderr_console, stdout_console
from polar_cli.replay import compare_sessions, load_session, replay_script

Source = Annotated[
    str,
    typer.Argument(
        help="A journal file (<data-dir>/journal/<session>.jsonl), a results file (polar run --out) with --session, "
        "or a session id.",
        show_default=False,
    ),
]


class ScriptDumper(yaml.SafeDumper):
    """YAML a reader can follow: token ids and logprobs on one line each, multi-line text as literal blocks."""


def _list(dumper: yaml.SafeDumper, data: list[object]) -> yaml.Node:
    flow = bool(data) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    block = "\n" in data and not any(c in data for c in "\r\t") and data == data.rstrip(" ")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if block else None)


ScriptDumper.add_representer(list, _list)
ScriptDumper.add_representer(str, _str)


def replay(
    source: Source,
    session: str | None = typer.Option(
        None, "--session", help="The session of a results file to replay (needed when it holds several)."
    ),
    journal: Annotated[Path | None, typer.Option(
        "--journal",
        help="The folder of the sessions' journals (default: polar-data/journal or journal, beside a results file, "
        "else here).",
        show_default=False,
    )] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the script here (.json: JSON; else YAML); default: stdout.", show_default=False
    )] = None,
    expect: bool = typer.Option(True, "--expect/--no-expect", help="Write each call's request as the turn's expect."),
    tokens: bool = typer.Option(
        True, "--tokens/--no-tokens", help="Write each call's sampled token ids and logprobs into its turn."
    ),
    check: str | None = typer.Option(
        None,
        "--check",
        help="Instead: compare a replayed run (a journal file or session id) with SOURCE, request for request; exit 1 "
        "where it diverged.",
        show_default=False,
    ),
    overwrite: bool = OverwriteOption,
) -> None:
    """Turn a recorded session into a script for the scripted backend, so a harness run can be reproduced without a
    model (polar run TASK --script script.yaml); each replayed request is checked against the original's."""
    console = stderr_console()
    if out is not None and check is None:
        refuse_existing(out, overwrite, "--out")
    original = load_session(source, session=session, journal_dir=journal)
    if check is not None:
        result = compare_sessions(original, load_session(check, journal_dir=journal, allow_empty=True))
        if result.divergence is not None:
            console.print(f"the replay diverged at call {result.call}: {result.divergence}", markup=False,
                          highlight=False, soft_wrap=True)  # fmt: skip
            raise typer.Exit(1)
        stdout_console().print(f"the replay matches: {result.calls} calls, the same requests in the same order",
                               markup=False, highlight=False)  # fmt: skip
        return
    script = replay_script(original, expect=expect, tokens=tokens)
    if out is not None and out.suffix == ".json":
        text = json.dumps(script, indent=1, ensure_ascii=False) + "\n"
    else:
        head = f"# polar replay of session {original.session_id} ({len(script)} calls, from {original.journal})\n"
        text = head + yaml.dump(script, Dumper=ScriptDumper, sort_keys=False, allow_unicode=True, width=120)
    if out is None:
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    console.print(f"{out}: {len(script)} turns replaying session {original.session_id}; play it with "
                  f"polar run TASK --script {out}", markup=False, highlight=False, soft_wrap=True)  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)
