from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from polar_cli.errors import NotImplementedYetError
from polar_cli.registry import LOAD_ENV, get_dataset, get_evaluator, reset_registry


def test_shows_up_in_polar_plugins() -> None:
    env = {**os.environ, LOAD_ENV: "swebench"}
    out = subprocess.run(
        [sys.executable, "-m", "polar_cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    rows = {(row["kind"], row["name"]): row["package"] for row in json.loads(out.stdout)}
    assert rows[("evaluator", "swebench_harness")] == "polar-swebench"
    assert rows[("dataset", "swegym")] == "polar-swebench"
    assert rows[("dataset", "swebench_verified")] == "polar-swebench"


def test_placeholders_raise_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOAD_ENV, "swebench")
    reset_registry()
    try:
        with pytest.raises(NotImplementedYetError, match=r"swegym.*not implemented yet"):
            list(get_dataset("swegym").tasks())
        with pytest.raises(NotImplementedYetError, match=r"swebench_harness.*not implemented yet"):
            asyncio.run(get_evaluator("swebench_harness").evaluate(None))
    finally:
        reset_registry()
