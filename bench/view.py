"""How fast ``polar view``'s page is in headless Chromium (Debian's chromium driven by Playwright,
``.ci/setup_browser.sh``), on synthetic results of two shapes:

- ``long``: one 200-turn session whose trace is 32K tokens (``--prompt`` first-prompt tokens, then per turn
  ``--sampled`` mask-1 tokens with text and logprobs and ``--interstitial`` mask-0 tokens), with its 400 messages;
- ``many``: ``--sessions`` sessions (10,000) of a small shape (a 2-call chain: 512 prompt tokens, 160 response tokens,
  4 messages), statuses, rewards and harnesses mixed.

    python bench/view.py [--sessions 10000] [--runs 3] [--json]

Per page, each a fresh tab, the median of ``--runs``:

- ``first paint``: the first contentful paint, from navigation start (the app draws the page: this is when the list
  or session is on screen);
- ``list ready``: the session list drawn and its handlers attached (the app's ``polar-list`` mark);
- ``session ready``: opening ``FILE#session=<id>`` in a new tab until the session page is drawn and interactive (its
  ``polar-session`` mark), lazily (the first tokens of each chain) and with ``all=1`` (every token);
- ``click to session``: in an open list (the session found by search), clicking it until its page is interactive.

Goal (issue 23): under 1 s each on this machine. The header gives the CPUs, Chromium's version, the page's size and
the time ``load_view`` + ``render_html`` took to write it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polar_cli.models import SessionResult, Trace, Trajectory
from polar_cli.view import load_view, render_html
from polar_cli.view.browser import chromium_path, headless_chromium

WORDS = ["Ġthe", "Ġfile", "Ġtest", "Ċ", "Ġdef", "(", ")", ":", "Ġreturn", "Ġhello", "_", "Ġpytest", "Ġ=", "."]


def synthetic_trace(rng: random.Random, prompt: int, turns: int, sampled: int, interstitial: int) -> Trace:
    ids: list[int] = []
    mask: list[int] = []
    entries: list[dict[str, Any]] = []
    for turn in range(turns):
        for _ in range(sampled):
            token_id = rng.randrange(1000, 150000)
            ids.append(token_id)
            mask.append(1)
            entries.append({"token": rng.choice(WORDS), "token_id": token_id, "logprob": -rng.expovariate(3.0)})
        if turn < turns - 1:
            for _ in range(interstitial):
                token_id = rng.randrange(1000, 150000)
                ids.append(token_id)
                mask.append(0)
                entries.append({"token": None, "token_id": token_id, "logprob": 0.0})
    messages: list[dict[str, Any]] = []
    for turn in range(turns - 1):
        args = json.dumps({"command": f"pytest tests/test_{turn}.py -q"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{turn}", "type": "function", "function": {"name": "bash", "arguments": args}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}",
                         "content": f"{turn} passed in 0.{turn % 10}s\n" + "." * rng.randrange(20, 200)})
    messages.append({"role": "assistant", "content": "All tests pass."})
    return Trace(prompt_ids=[rng.randrange(1000, 150000) for _ in range(prompt)], response_ids=ids, loss_mask=mask,
                 response_logprobs=entries,  # type: ignore[arg-type]
                 prompt_messages=[{"role": "system", "content": "You are a coding agent. " * 40},
                                  {"role": "user", "content": "Make the tests pass."}],
                 response_messages=messages, finish_reason="stop", role="main", role_reason="the session's first chain",
                 metadata={"harness": "pi"})  # fmt: skip


def synthetic_session(rng: random.Random, n: int, *, prompt: int, turns: int, sampled: int,
                      interstitial: int) -> SessionResult:  # fmt: skip
    status = rng.choices(["completed", "timeout", "error"], [8, 1, 1])[0]
    reward = float(rng.random() < 0.5) if status == "completed" else None
    trace = synthetic_trace(rng, prompt, turns, sampled, interstitial)
    trajectory = Trajectory(session_id=f"s-{n}", status=status, traces=[trace], reward=reward,
                            metadata={"builder": "prefix_merging", "chains": 1, "breaks": []})  # fmt: skip
    evaluation = {"exit_code": 0 if reward else 1, "tests": [{"name": f"test_{k}", "status": rng.choice(
        ["passed", "failed"])} for k in range(3)]}  # fmt: skip
    return SessionResult(session_id=f"s-{n}", task_id=f"task-{n // 8}", sample_index=n % 8, status=status,
                         trajectory=trajectory, reward=reward, num_completions=turns,
                         error="deadline reached" if status == "timeout" else None,
                         metadata={"evaluation": evaluation})  # fmt: skip


def write_page(folder: Path, name: str, sessions: list[SessionResult]) -> tuple[Path, float]:
    results = folder / f"{name}.jsonl"
    with results.open("w", encoding="utf-8") as f:
        for s in sessions:
            f.write(s.model_dump_json() + "\n")
    started = time.perf_counter()
    page = folder / f"{name}.html"
    page.write_text(render_html(load_view(results)), encoding="utf-8")
    return page, time.perf_counter() - started


def _marks(page: Any, mark: str) -> dict[str, float]:
    page.wait_for_selector(f"html[data-ready={mark.split('-')[1]}]", state="attached", timeout=60_000)
    page.wait_for_timeout(50)  # let the paint entry land
    found: dict[str, float] = page.evaluate("""mark => ({
        paint: (performance.getEntriesByName('first-contentful-paint')[0] || {startTime: NaN}).startTime,
        ready: (performance.getEntriesByName(mark).slice(-1)[0] || {startTime: NaN}).startTime})""", mark)
    return found


def measure(browser: Any, url: str, mark: str) -> dict[str, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(url, wait_until="commit")
        return _marks(page, mark)
    finally:
        page.close()


def click_to_session(browser: Any, url: str, session_id: str) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(url)
        page.wait_for_selector("html[data-ready=list]", state="attached", timeout=60_000)
        page.fill("#q", session_id)  # a row past the first page: found by search, as a user would
        row = page.locator(f'[data-session-id="{session_id}"]')
        row.wait_for(timeout=60_000)
        started = time.perf_counter()
        row.click()
        page.wait_for_selector("html[data-ready=session]", state="attached", timeout=60_000)
        return (time.perf_counter() - started) * 1000
    finally:
        page.close()


def median(runs: int, one: Callable[[], float]) -> float:
    return statistics.median(one() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--prompt", type=int, default=8192)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sampled", type=int, default=40)
    parser.add_argument("--interstitial", type=int, default=80)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    args = parser.parse_args()
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="polar-view-bench-") as tmp:
        folder = Path(tmp)
        long = synthetic_session(rng, 0, prompt=args.prompt, turns=args.turns, sampled=args.sampled,
                                 interstitial=args.interstitial)  # fmt: skip
        trace = long.trajectory.traces[0]
        long_tokens = len(trace.prompt_ids) + len(trace.response_ids)
        many = [synthetic_session(rng, n, prompt=512, turns=2, sampled=80, interstitial=40)
                for n in range(args.sessions)]  # fmt: skip
        pages = {"long": write_page(folder, "long", [long]), "many": write_page(folder, "many", many)}
        with headless_chromium() as browser:
            version = browser.version
            for name, (page_file, build) in pages.items():
                url = page_file.as_uri()
                target = "s-0" if name == "long" else f"s-{args.sessions // 2}"
                label = (f"1 session, {args.turns} turns, {long_tokens:,}-token trace" if name == "long"
                         else f"{args.sessions:,} sessions")  # fmt: skip
                size = page_file.stat().st_size / 2**20
                cases = [("list", url, "polar-list"), ("session (lazy)", f"{url}#session={target}", "polar-session"),
                         ("session (all=1)", f"{url}#session={target}&all=1", "polar-session")]  # fmt: skip
                for case, case_url, mark in cases:
                    found = [measure(browser, case_url, mark) for _ in range(args.runs)]
                    rows.append({"input": label, "page MiB": round(size, 1), "build s": round(build, 2),
                                 "view": case, "first paint ms": round(statistics.median(f["paint"] for f in found)),
                                 "ready ms": round(statistics.median(f["ready"] for f in found))})  # fmt: skip
                click = median(args.runs, lambda u=url, t=target: click_to_session(browser, u, t))
                rows.append({"input": label, "page MiB": round(size, 1), "build s": round(build, 2),
                             "view": "click to session", "first paint ms": None, "ready ms": round(click)})  # fmt: skip
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "chromium": version, "rows": rows}, indent=2))
        return
    print(f"polar view in headless {version} ({chromium_path()}), {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; median of {args.runs} fresh tabs")  # fmt: skip
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(("" if r[c] is None else str(r[c])).ljust(w) for c, w in zip(columns, widths, strict=True)))


if __name__ == "__main__":
    main()
