"""A ``polar proxy`` killed with SIGKILL under load, again and again, restarted on the same journal dir: every call a
client saw answered is in the journal exactly once, ids stay unique, and every session's journal reads."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest

from polar_cli.proxy.journal import read_journal
from tests.support.proxy_process import start_proxy

from .conftest import LoopThread
from .upstream import Upstream

TOKEN = "crash-test-token"
SESSIONS = ["s0", "s1", "s2"]
ROUNDS = 5
CLIENTS_PER_SESSION = 2


class Proxy:
    def __init__(self, upstream: Upstream, journal: Path) -> None:
        self.proc, self.url = start_proxy([
            "--backend", "vllm", "--backend-url", upstream.url, "--model", "served-model", "--journal", str(journal),
            "--control-token", TOKEN,
        ])  # fmt: skip

    def open_sessions(self) -> dict[str, dict[str, str]]:
        """(Re-)create every session with its fixed id, as a restarted gateway would: id → {key, url}."""
        out = {}
        for sid in SESSIONS:
            resp = httpx.post(f"{self.url}/sessions", json={"session_id": sid},
                              headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            assert resp.status_code == 201, resp.text
            info = resp.json()
            out[sid] = {"key": info["api_key"], "url": info["base_urls"]["openai"] + "/chat/completions"}
        return out

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate()


def _client(target: dict[str, str], prefix: str, answered: list[str], stop: threading.Event) -> None:
    n = 0
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            nonce = f"{prefix}-{n}"
            n += 1
            try:
                resp = http.post(target["url"], headers={"Authorization": f"Bearer {target['key']}"},
                                 json={"model": "m", "messages": [{"role": "user", "content": nonce}]})  # fmt: skip
            except httpx.HTTPError:
                return  # the proxy died under us: this call was not answered
            if resp.status_code == 200:
                assert resp.json()["choices"][0]["message"]["content"] == f"echo: {nonce}"
                answered.append(nonce)


@pytest.mark.parametrize("calls_per_round", [40])
def test_kill_9_under_load_loses_no_answered_call(
    loop_thread: LoopThread, tmp_path: Path, calls_per_round: int
) -> None:
    upstream = Upstream(loop_thread, prompt_tokens=20000)  # ~100 KB lines: kills land inside writes too
    journal = tmp_path / "journal"
    answered: list[str] = []
    torn_by_hand = b'{"completion_id":"s1-999","session_id":"s1","index":999,"prompt_ids":[1,2,3'
    for round_ in range(ROUNDS):
        proxy = Proxy(upstream, journal)
        try:
            targets = proxy.open_sessions()
            stop = threading.Event()
            before = len(answered)
            threads = [
                threading.Thread(target=_client, args=(targets[sid], f"r{round_}-{sid}-c{c}", answered, stop))
                for sid in SESSIONS
                for c in range(CLIENTS_PER_SESSION)
            ]
            for thread in threads:
                thread.start()
            while len(answered) - before < calls_per_round and any(t.is_alive() for t in threads):
                threads[0].join(timeout=0.01)
        finally:
            proxy.kill()  # SIGKILL mid-load: no cleanup, writes cut wherever they were
        stop.set()
        for thread in threads:
            thread.join()
        assert len(answered) - before >= calls_per_round  # the load was real
        if round_ == 1:
            with open(journal / "s1.jsonl", "ab") as fh:  # a power loss in the middle of a write
                fh.write(torn_by_hand)
    final = Proxy(upstream, journal)
    try:
        final.open_sessions()  # opening repairs any torn tail
        auth = {"Authorization": f"Bearer {TOKEN}"}
        over_http = {sid: httpx.get(f"{final.url}/sessions/{sid}/completions", headers=auth).json() for sid in SESSIONS}
    finally:
        final.kill()
    seen: Counter[str] = Counter()
    for sid in SESSIONS:
        path = journal / f"{sid}.jsonl"
        lines = path.read_bytes().splitlines()
        records = read_journal(path)
        assert len(records) == len(lines)  # every line is a valid Completion: nothing glued, nothing torn
        assert [r["completion_id"] for r in over_http[sid]] == [r.completion_id for r in records]
        ids = [r.completion_id for r in records]
        assert len(set(ids)) == len(ids), "completion ids must be unique"
        assert all(r.session_id == sid and r.completion_id == f"{sid}-{r.index}" for r in records)
        for record in records:
            nonce = record.request["messages"][-1]["content"]
            assert record.response_message["content"] == f"echo: {nonce}"
            seen[nonce] += 1
    torn = [p.read_bytes() for p in journal.glob("s1.jsonl.torn-*")]  # a kill may have torn that line already
    assert any(t.endswith(torn_by_hand) for t in torn)
    missing = [n for n in answered if seen[n] != 1]
    assert not missing, f"answered calls not journaled exactly once: {missing[:10]}"
    assert all(count == 1 for count in seen.values())  # unanswered calls may be journaled, but only once
    assert orjson.dumps(sorted(seen)) and len(answered) >= ROUNDS * calls_per_round
