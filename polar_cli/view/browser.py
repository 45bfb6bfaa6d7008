"""Headless Chromium for the view's tests and ``bench/view.py``: Playwright from PyPI (the ``dev`` extra) driving the
system's Chromium (Debian's ``chromium``, ``.ci/setup_browser.sh``); no browser is ever downloaded.
``POLAR_CHROMIUM`` names another executable."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polar_cli.extras import require

DEFAULT_CHROMIUM = "/usr/bin/chromium"


def chromium_path() -> str | None:
    """The Chromium executable to drive, or None when there is none."""
    configured = os.environ.get("POLAR_CHROMIUM")
    for candidate in (configured, DEFAULT_CHROMIUM, shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def missing_browser_reason() -> str | None:
    """Why the browser checks cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; it is in the dev extra)"
    if chromium_path() is None:
        return "no chromium executable (run .ci/setup_browser.sh, or set POLAR_CHROMIUM)"
    return None


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A launched Playwright ``Browser`` on the system Chromium."""
    sync_api = require("playwright.sync_api", needed_by="the polar view browser checks", extra="dev")
    path = chromium_path()
    if path is None:
        raise FileNotFoundError("no chromium executable (run .ci/setup_browser.sh, or set POLAR_CHROMIUM)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()
