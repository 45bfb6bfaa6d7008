"""Suite-wide isolation: no stray installed plugin is loaded unless a test asks for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_cli.registry import LOAD_ENV, reset_registry
from tests.support.xdist_groups import assign_groups

SHARED_FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
LOCAL_FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def _isolated_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(LOAD_ENV, "")
    reset_registry()
    yield
    reset_registry()


def shared_fixture(name: str) -> Any:
    """A fixture from ../shared/fixtures (the paper's appendix), or the copy kept in tests/fixtures."""
    for base in (SHARED_FIXTURES, LOCAL_FIXTURES / "paper"):
        path = base / name
        if path.exists():
            return json.loads(path.read_text())
    raise FileNotFoundError(name)

@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's xdist worker group (tests/support/xdist_groups.py); pytest calls this once for the whole run."""
    assign_groups(items)
