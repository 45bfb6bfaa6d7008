"""``polar view`` without a browser: the three inputs load into the view model, the page embeds them safely, the
server serves it read-only, the command writes it where it says."""

from __future__ import annotations

import contextlib
import html
import http.client as http_client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from polar_cli.errors import ConfigError
from polar_cli.view import ViewServer, load_view, render_html
from tests.commands.test_export import generated_folder
from tests.view.sessions import HOSTILE, results_file, session

ROOT = Path(__file__).resolve().parents[2]


def test_a_results_file_loads_with_chains_their_starts_and_the_evaluator_report(tmp_path: Path) -> None:
    results_file(tmp_path / "out.jsonl", [session("a"), session("b", reward=0.0, status="timeout")])
    view = load_view(tmp_path / "out.jsonl")
    assert (view.kind, [s.session_id for s in view.sessions]) == ("results", ["a", "b"])
    first = view.sessions[0]
    assert (first.harness, first.completions, len(first.chains), first.status) == ("pi", 5, 2, "completed")
    assert first.trainable_tokens == sum(sum(c.loss_mask) for c in first.chains) == 9 + 6
    assert first.chains[0].start is None
    assert first.chains[1].start is not None and first.chains[1].start.cause == "new_context"
    start = first.chains[1].start
    assert (start.first_difference, start.expected_ids, start.found_ids) == (0, [1, 2, 3], [5, 4, 3, 2, 1])
    assert first.chains[1].detail()["start"]["found"] == [5, 4, 3, 2, 1] and first.chains[0].detail()["exact"]
    assert first.evaluation is not None and first.evaluation["tests"][1]["status"] == "failed"
    assert first.chains[0].tokens is not None and first.chains[0].tokens[0] == "Ġhello"
    assert first.chains[0].tokens[3] is None  # a mask-0 token has no text
    assert view.sessions[1].index_row(1)["st"] == "timeout"


def test_a_generate_folder_and_its_exported_dataset_load(tmp_path: Path) -> None:
    folder = generated_folder(tmp_path / "rollouts")
    view = load_view(folder)
    assert view.kind == "generate" and [s.session_id for s in view.sessions] == ["s0", "s1", "s2"]
    assert all(s.harness == "pi" and s.accepted for s in view.sessions)
    from polar_cli.export import export

    export(folder, tmp_path / "dataset")
    data = load_view(tmp_path / "dataset")
    assert data.kind == "dataset" and [s.session_id for s in data.sessions] == ["s0", "s1", "s2"]
    chain = data.sessions[0].chains[0]
    assert (chain.response_ids, chain.loss_mask, chain.logprobs, data.sessions[0].split) == (
        [3, 4], [1, 0], [-0.5, 0.0], "train")


def test_a_trace_that_is_not_context_exact_and_a_break_from_older_results_load(tmp_path: Path) -> None:
    older = session("old")
    breaks = older.trajectory.metadata["breaks"]
    for key in ("first_difference", "expected_ids", "found_ids"):
        del breaks[0][key]  # written before breaks said where the prompt departed
    results_file(tmp_path / "out.jsonl", [session("new", inexact=True), older])
    new, old = load_view(tmp_path / "out.jsonl").sessions
    assert [c.context_exact for c in new.chains] == [False, True] and new.chains[0].detail()["exact"] is False
    start = old.chains[1].start
    assert start is not None and (start.first_difference, start.expected_ids, start.found_ids) == (None, None, None)
    assert old.chains[1].detail()["start"]["at"] is None
    html = render_html(load_view(tmp_path / "out.jsonl"))
    assert "context not exact" in html  # the page's script knows the flag


def test_bad_inputs_are_one_line_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_view(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="none of a polar generate folder"):
        load_view(tmp_path)
    (tmp_path / "bad.jsonl").write_text(session("a").model_dump_json() + "\n" + '{"session_id": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not a SessionResult"):
        load_view(tmp_path / "bad.jsonl")


def test_hostile_content_cannot_end_a_script_block_or_add_markup(tmp_path: Path) -> None:
    results_file(tmp_path / "out.jsonl", [session('x"><img src=y>', hostile=True)])
    page = render_html(load_view(tmp_path / "out.jsonl"))
    assert page.count("</script>") == page.count("<script") == 4  # header, index, the app, one session
    blocks = re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, flags=re.S)
    assert [name for name, _ in blocks] == ["polar-header", "polar-index", "polar-s0"]
    detail = json.loads(blocks[2][1])
    assert detail["error"] == "boom" + HOSTILE and detail["id"] == 'x"><img src=y>'
    outside = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    assert "pwned" not in outside and "<img" not in outside
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp is not None and "default-src 'none'" in csp.group(1) and "'unsafe-inline'" not in csp.group(1).split(
        "style-src")[0]


def test_the_server_serves_the_page_read_only_on_localhost() -> None:
    server = ViewServer(b"<!doctype html><p>hi</p>")
    server.start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            assert answer.read() == b"<!doctype html><p>hi</p>"
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
        for method, path, code in (("GET", "other", 404), ("POST", "", 501), ("PUT", "", 501)):
            request = urllib.request.Request(server.url + path, method=method, data=b"x" if method != "GET" else None)
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=10)
            assert caught.value.code == code
            caught.value.close()
    finally:
        server.shutdown()
        server.server_close()


def test_polar_view_writes_name_dot_html_here_by_default(tmp_path: Path) -> None:
    results_file(tmp_path / "results.jsonl", [session("a")])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "polar_cli", "view", "results.jsonl"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1 sessions -> results.html (open file://")
    assert html.escape("polar view: results.jsonl") in (tmp_path / "results.html").read_text()
    done = subprocess.run([sys.executable, "-m", "polar_cli", "view", "missing.jsonl"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and done.stderr.strip() == "Error: missing.jsonl: no such file or folder"


def test_the_page_the_readme_writes_is_ignored_by_git() -> None:
    """The README's ``polar view results.jsonl`` writes ``results.html`` in the checkout: git must not offer it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in ("results.html", "results.jsonl"):
        done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", name], timeout=60)
        assert done.returncode == 0, f"{name} is not in .gitignore"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_on_sigterm_or_ctrl_c_and_says_so(tmp_path: Path, signum: int) -> None:
    """A real ``polar view --serve`` process: the signal ends it (no second signal, no kill needed), with one line
    saying it stopped and the shell's exit code for the signal; the port is closed afterwards."""
    results_file(tmp_path / "results.jsonl", [session("a")])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "polar_cli", "view", "results.jsonl", "--serve"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with subprocess.Popen(argv, cwd=tmp_path, env=env, text=True, **pipes) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            url = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
            assert url is not None, line
            with urllib.request.urlopen(url.group(1), timeout=30) as answer:
                assert answer.status == 200
            proc.send_signal(signum)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum
    assert err.strip() == f"stopped ({name}); no longer serving {url.group(1)}"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url.group(1), timeout=10)


def test_a_signal_while_the_server_starts_a_request_thread_still_stops_it() -> None:
    """The CI failure: the signal landed while ``serve_forever`` was starting a request's thread, where socketserver
    catches ``Exception`` (and prints it), so the stop was swallowed and the server went on serving. Deterministic: the
    signal is sent from inside ``process_request``."""
    from polar_cli.commands.interrupt import Interrupted, stop_on_signals

    class SignalledMidRequest(ViewServer):
        def process_request(self, request: object, client_address: object) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            super().process_request(request, client_address)  # type: ignore[arg-type]

    def fetch() -> None:
        with contextlib.suppress(OSError, http_client.HTTPException):  # the stopped server never answers
            urllib.request.urlopen(http.url, timeout=30).read()

    http = SignalledMidRequest(b"<html></html>")
    client = threading.Thread(target=fetch)
    client.start()
    try:
        with pytest.raises(Interrupted) as stop, stop_on_signals():
            http.serve_forever()
        assert stop.value.name == "SIGTERM"
    finally:
        http.server_close()
        client.join(timeout=30)
