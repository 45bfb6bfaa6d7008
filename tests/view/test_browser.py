"""The page in headless Chromium (Debian's chromium driven by Playwright): no console error, hostile content stays
text, every mask-1 token drawn with ``all=1``, lazy drawing otherwise, the list's filters and search."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_cli.view import load_view, render_html
from tests.view.browser import drawn_masks, need_browser, opened
from tests.view.sessions import HOSTILE, results_file, session, trace


@pytest.fixture
def page_file(tmp_path: Path) -> Path:
    need_browser()
    sessions = [session(f"s-{n}", reward=float(n % 2), status="completed" if n % 3 else "timeout", inexact=n == 21)
                for n in range(30)]  # fmt: skip
    sessions.append(session('evil"><img src=y>', hostile=True))
    results_file(tmp_path / "out.jsonl", sessions)
    out = tmp_path / "view.html"
    out.write_text(render_html(load_view(tmp_path / "out.jsonl")), encoding="utf-8")
    return out


def test_the_list_filters_searches_and_opens_a_session_with_its_messages(page_file: Path) -> None:
    from playwright.sync_api import expect

    with opened(page_file) as (page, errors):
        assert page.locator("[data-session-id]").count() == 31
        page.select_option("#f-st", "timeout")
        expect(page.locator("[data-session-id]")).to_have_count(10)
        page.select_option("#f-st", "")
        page.fill("#q", "s-2")
        expect(page.locator("[data-session-id]")).to_have_count(11)  # s-2, s-20..s-29
        page.locator('[data-session-id="s-21"]').click()
        page.wait_for_selector("html[data-ready=session]", state="attached")
        assert page.evaluate("location.hash") == "#session=s-21"
        messages = page.locator("#session .msg")
        assert messages.count() == 4 + 5 and "echo hi > hello.txt" in messages.nth(1).inner_text()
        boundary = page.inner_text("#session .boundary[data-cause=new_context]")
        assert "sub-agent (new context)" in boundary
        assert "departs at token 0: expected [1, 2, 3], found [5, 4, 3, 2, 1]" in boundary
        assert page.locator("#session .inexact").count() == 1  # the main chain says context_exact: false
        assert "test_other" in page.inner_text("#session section.block")  # the evaluator report
        token = page.locator('#session .rtoks [data-mask="1"]').first
        token.hover()
        assert "logprob -0.05" in page.inner_text("#tip") and token.get_attribute("data-logprob") == "-0.05"
        assert token.inner_text() == " hello"  # byte-level "Ġhello" decoded
        page.click("a.back")
        page.wait_for_selector("html[data-ready=list]", state="attached")
        assert errors == []


def test_hostile_content_is_shown_as_text_and_runs_nothing(page_file: Path) -> None:
    fragment = "session=" + 'evil"><img src=y>'.replace('"', "%22").replace(">", "%3E").replace("<", "%3C") + "&all=1"
    with opened(page_file, fragment) as (page, errors):
        assert page.evaluate("document.documentElement.dataset.ready") == "session"
        assert page.evaluate("window.__pwned === undefined && !document.getElementById('pwned')")
        assert page.locator("img").count() == 0
        text = page.inner_text("#session")
        assert "boom" + HOSTILE in text and "write hello.txt" + HOSTILE in text
        page.click("a.back")
        page.wait_for_selector("html[data-ready=list]", state="attached")
        assert page.evaluate("window.__pwned === undefined") and page.locator("img").count() == 0
        assert errors == []


def test_all_1_draws_every_token_and_without_it_a_long_trace_is_drawn_lazily(tmp_path: Path) -> None:
    need_browser()
    long = session("long")
    long.trajectory.traces[0] = trace(2000, 400, sampled=60, interstitial=20)  # 32,000 response tokens
    results_file(tmp_path / "out.jsonl", [long])
    out = tmp_path / "view.html"
    out.write_text(render_html(load_view(tmp_path / "out.jsonl")), encoding="utf-8")
    masks = [t.loss_mask for t in long.trajectory.traces]
    with opened(out, "session=long&all=1") as (page, errors):
        drawn = drawn_masks(page)
        assert [d["one"] for d in drawn] == [sum(m) for m in masks] == [24_000, 6]
        assert [d["zero"] for d in drawn] == [len(m) - sum(m) for m in masks]
        assert [d["prompt"] for d in drawn] == [2000, 5] and [d["all_one"] for d in drawn] == [24_000, 6]
        assert errors == []
    with opened(out, "session=long") as (page, errors):
        first = drawn_masks(page)[0]
        assert first["prompt"] == 0 and 0 < first["one"] + first["zero"] < 32_000
        page.locator("#session section.chain").first.locator("button.more").click()
        assert drawn_masks(page)[0]["one"] + drawn_masks(page)[0]["zero"] > first["one"] + first["zero"]
        assert errors == []
