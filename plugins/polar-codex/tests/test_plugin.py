from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polar_cli.errors import NotImplementedYetError
from polar_cli.registry import LOAD_ENV, get_harness, reset_registry


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "codex"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    rows = json.loads(out.stdout)
    assert {"kind": "harness", "name": "codex", "package": "polar-codex"}.items() <= next(
        row for row in rows if row["name"] == "codex"
    ).items()


def test_placeholder_raises_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOAD_ENV, "codex")
    reset_registry()
    try:
        with pytest.raises(NotImplementedYetError, match="not implemented yet"):
            get_harness("codex").launch(None)
    finally:
        reset_registry()
