"""``--retention-max-age``, ``--retention-max-bytes``, ``--retention-mode``: one definition for ``polar serve`` and
``polar generate`` (``polar_cli.server.retention.RetentionConfig`` checks the values, naming the field)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

RetentionMaxAge = Annotated[
    str | None,
    typer.Option(
        "--retention-max-age",
        help="Compact or remove the tasks acknowledged this long ago (seconds, or 12h, 7d, ...). Default: kept.",
        show_default=False,
    ),
]
RetentionMaxBytes = Annotated[
    str | None,
    typer.Option(
        "--retention-max-bytes",
        help="While the results and journals kept are over this (bytes, or 500MB, 50GB, ...), compact or remove the "
        "oldest acknowledged tasks. Default: no cap.",
        show_default=False,
    ),
]
RetentionModeOption = Annotated[
    str | None,
    typer.Option(
        "--retention-mode",
        help="remove (default: results and files go, the server answers 410 for the task) or compact (traces and "
        "files go, result summaries stay).",
        show_default=False,
    ),
]


def retention_flags(max_age: str | None, max_bytes: str | None, mode: str | None) -> dict[str, Any]:
    """The flags given, as ``RetentionConfig`` fields."""
    given = {"max_age": max_age, "max_bytes": max_bytes, "mode": mode}
    return {key: value for key, value in given.items() if value is not None}
