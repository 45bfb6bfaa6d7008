"""Browser checks shared by the view's tests: a page opened in headless Chromium, its console errors collected."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from polar_cli.harnesses.testing import in_ci
from polar_cli.view.browser import headless_chromium, missing_browser_reason


def need_browser() -> None:
    reason = missing_browser_reason()
    if reason:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def opened(page_file: Path, fragment: str = "", *, width: int = 1400,
           height: int = 900) -> Iterator[tuple[Any, list[str]]]:  # fmt: skip
    """``page_file#fragment`` in a fresh page, waited for until the app says it is ready; with the console errors
    (and uncaught exceptions) of the page so far and later."""
    with headless_chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": height})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.goto(f"{page_file.resolve().as_uri()}{'#' + fragment if fragment else ''}")
        page.wait_for_selector("html[data-ready]", state="attached", timeout=30_000)
        yield page, errors


def drawn_masks(page: Any) -> list[dict[str, int]]:
    """Per chain section of the open session: its ``data-mask`` 1 and 0 response tokens and its prompt tokens."""
    result: list[dict[str, int]] = page.eval_on_selector_all("#session section.chain", """ss => ss.map(s => ({
        one: s.querySelectorAll('.rtoks [data-mask="1"]').length,
        zero: s.querySelectorAll('.rtoks [data-mask="0"]').length,
        prompt: s.querySelectorAll('[data-part="prompt"]').length,
        all_one: s.querySelectorAll('[data-mask="1"]').length}))""")
    return result
