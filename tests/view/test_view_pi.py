"""``polar view`` on real results of ``polar run`` with the pi CLI (the README's example: the scripted backend plays
the model, pi writes hello.txt with its bash tool), in headless Chromium: no console error, every trace's mask-1
tokens drawn (``all=1``) equal its loss mask's sum, clicking a session shows its messages; the screenshot is saved
under ``$POLAR_TEST_ARTIFACTS`` (else the test's tmp folder) and, with ``POLAR_REFRESH_SCREENSHOT=1``, replaces the
README's ``docs/img/polar-view.png``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polar_cli.harnesses.testing import check_run, in_ci, missing_cli_reason, polar_run_file
from polar_cli.registry import get_harness
from tests.view.browser import drawn_masks, need_browser, opened

pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[2]
README_IMAGE = ROOT / "docs" / "img" / "polar-view.png"


def test_polar_view_of_a_real_pi_run_in_chromium(tmp_path: Path) -> None:
    need_browser()
    reason = missing_cli_reason(get_harness("pi"))
    if reason:
        pytest.fail(reason) if in_ci() else pytest.skip(reason)
    reports = polar_run_file(Path("examples", "pi-hello.yaml"), tmp_path, "--script", "examples/scripts/pi-hello.yaml",
                             cwd=ROOT)  # fmt: skip
    for report in reports:
        check_run(report)
    results = [r.result for r in reports if r.result is not None]
    shutil.copyfile(tmp_path / "out.jsonl", tmp_path / "results.jsonl")
    page_file = tmp_path / "results.html"  # the README's command, as written
    done = subprocess.run([sys.executable, "-m", "polar_cli", "view", "results.jsonl"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    for result in results:
        with opened(page_file, f"session={result.session_id}&all=1") as (page, errors):
            drawn = drawn_masks(page)
            traces = result.trajectory.traces
            assert [d["one"] for d in drawn] == [sum(t.loss_mask) for t in traces]
            assert [d["all_one"] for d in drawn] == [sum(t.loss_mask) for t in traces]
            assert [d["one"] + d["zero"] for d in drawn] == [len(t.response_ids) for t in traces]
            assert errors == []
    artifacts = Path(os.environ.get("POLAR_TEST_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    with opened(page_file, width=1280, height=860) as (page, errors):
        assert page.locator("[data-session-id]").count() == len(results)
        page.locator("[data-session-id]").first.click()
        page.wait_for_selector("html[data-ready=session]", state="attached")
        messages = page.locator("#session .msg")
        assert messages.count() >= 4
        text = page.inner_text("#session .msgs")
        assert "hello from polar" in text and "bash" in text  # the instruction, the tool call, its result
        page.locator('#session .rtoks [data-mask="1"]').nth(8).hover()
        assert "logprob" in page.inner_text("#tip")
        page.screenshot(path=str(artifacts / "polar-view.png"))
        assert errors == []
    if os.environ.get("POLAR_REFRESH_SCREENSHOT", "") not in ("", "0"):
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifacts / "polar-view.png", README_IMAGE)
