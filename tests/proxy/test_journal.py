"""Journal guarantees: only answered, checked calls are journaled; ids stay unique across restarts; a torn tail is
repaired; one bad line never makes a session unreadable."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from polar_cli.proxy import journal as journal_module
from polar_cli.proxy.journal import INLINE_BYTES, Journal, read_journal, read_raw

from .conftest import LoopThread, ProxySession, RunningProxy
from .upstream import Upstream, vllm_answer


def chat(session: ProxySession, text: str = "hi", stream: bool = False) -> httpx.Response:
    return httpx.post(
        f"{session.openai_base}/chat/completions",
        headers={"Authorization": f"Bearer {session.api_key}"},
        json={"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream},
        timeout=30,
    )


def journal_of(running: RunningProxy, session: ProxySession) -> Path:
    return Path(running.http.get(f"/sessions/{session.session_id}").json()["journal"])


@pytest.fixture
def upstream(loop_thread: LoopThread) -> Upstream:
    return Upstream(loop_thread)


def vllm_proxy(start_proxy: Callable[..., RunningProxy], upstream: Upstream, **config: Any) -> RunningProxy:
    retry = {"attempts": 3, "base_delay_s": 0.001, "max_delay_s": 0.002}
    return start_proxy(backend="vllm", backend_url=upstream.url, model="served-model", retry=retry, **config)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_that_fails_after_the_backend_answered_is_not_journaled(
    synthetic_proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Synthetic mode: the answer is encoded whole before anything is sent (pass-through: the next test)."""
    session = synthetic_proxy.new_session(script=[{"content": "one"}, {"content": "two"}])

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("encoder broke")

    from polar_cli.proxy.codecs import get_codec

    codec = get_codec("openai_chat")
    assert codec is not None
    monkeypatch.setattr(type(codec), "stream" if stream else "encode", boom)
    resp = chat(session, stream=stream)
    assert resp.status_code == 500 and "encoder broke" in resp.text
    assert session.completions() == []
    monkeypatch.undo()
    assert chat(session, stream=stream).status_code == 200
    [record] = session.completions()
    assert record["index"] == 0 and record["metadata"]["delivery"] == "answered"


def test_a_passthrough_stream_whose_encoding_fails_ends_in_an_error_event_and_journals_nothing(
    proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = proxy.new_session(script=[{"content": "one two"}, {"content": "three"}])
    from polar_cli.proxy.codecs import get_codec

    codec = get_codec("openai_chat")
    assert codec is not None
    real = type(codec).encoder

    def broken(self: Any, request: Any) -> Any:
        encoder = real(self, request)
        assert encoder is not None

        def delta(piece: Any) -> bytes:
            raise RuntimeError("encoder broke")

        encoder.delta = delta  # type: ignore[method-assign]
        return encoder

    monkeypatch.setattr(type(codec), "encoder", broken)
    resp = chat(session, stream=True)
    assert resp.status_code == 200  # the headers were out before the first piece
    frames = [f for f in resp.text.split("\n\n") if f]
    assert "encoder broke" in frames[-1] and '"error"' in frames[-1]  # the stream ends in an error event
    assert session.completions() == []
    monkeypatch.undo()
    assert chat(session, stream=True).status_code == 200
    [record] = session.completions()
    assert record["index"] == 0 and record["metadata"]["delivery"] == "answered"


@pytest.mark.parametrize(
    "bad",
    [
        {"token_ids": "abc"},
        {"token_ids": [1, "x", 2]},
        {"token_ids": [1, -2, 3]},
        {"logprobs": {"content": [{"token": "t", "logprob": "nan"}] * 3}},
        {"logprobs": {"content": [{"token": "t", "logprob": "bad"}] * 3}},
        {"message": "not an object"},
        "prompt",
    ],
)
def test_invalid_token_data_is_a_502_and_not_journaled(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream, bad: Any
) -> None:
    running = vllm_proxy(start_proxy, upstream)
    session = running.new_session()
    assert chat(session, "good").status_code == 200
    answer = vllm_answer(prompt_ids=[1, 2, 3]) if bad == "prompt" else vllm_answer(**bad)
    raw = orjson.dumps(answer)
    if bad == "prompt":  # ids that are not ints, in the part vLLM answers as JSON text the proxy never parses
        raw = raw.replace(b'"prompt_token_ids":[1,2,3]', b'"prompt_token_ids":[1,"a",3]')
    upstream.actions.append(("json", 200, orjson.loads(raw), None))
    resp = chat(session, "bad")
    assert resp.status_code == 502, resp.text
    assert "backend answered" in resp.json()["error"]["message"]  # invalid token data, or a malformed body
    assert upstream.requests == 2  # an invalid answer is not retried
    assert chat(session, "after").status_code == 200
    records = session.completions()  # the session's journal still reads, without the bad call
    assert [r["response_message"]["content"] for r in records] == ["echo: good", "echo: after"]
    assert [r.index for r in read_journal(journal_of(running, session))] == [0, 1]


def test_a_restart_after_an_index_gap_keeps_ids_unique(
    start_proxy: Callable[..., RunningProxy], tmp_path: Path
) -> None:
    first = start_proxy(journal_dir=tmp_path)
    session = first.new_session(session_id="gap", script=[{"content": str(i)} for i in range(6)])
    for _ in range(3):
        assert chat(session).status_code == 200
    assert first.http.delete("/sessions/gap").status_code == 200
    path = tmp_path / "gap.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[2])  # indices 0 and 2 on disk: two lines, the next id is 3
    second = start_proxy(journal_dir=tmp_path)
    again = second.new_session(session_id="gap", script=[{"content": "x"}])
    assert second.http.get("/sessions/gap").json()["completions"] == 3
    assert chat(again).status_code == 200
    ids = [c.completion_id for c in read_journal(path)]
    assert ids == ["gap-0", "gap-2", "gap-3"] and len(set(ids)) == len(ids)


def test_a_torn_last_line_is_repaired_and_the_next_record_starts_its_own_line(
    start_proxy: Callable[..., RunningProxy], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = start_proxy(journal_dir=tmp_path)
    session = first.new_session(session_id="torn", script=[{"content": "a"}, {"content": "b"}])
    assert chat(session).status_code == 200 and chat(session).status_code == 200
    assert first.http.delete("/sessions/torn").status_code == 200
    path = tmp_path / "torn.jsonl"
    good = path.read_bytes()
    torn = b'{"completion_id":"torn-2","session_id":"torn","index":2,"provider":"openai_chat","prompt_ids":[1,2,'
    path.write_bytes(good + torn)  # what a power loss in the middle of a write leaves
    second = start_proxy(journal_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="polar.proxy.journal"):
        again = second.new_session(session_id="torn", script=[{"content": "c"}])
    assert "torn last line" in caplog.text
    assert path.read_bytes() == good  # every complete line kept
    assert (tmp_path / "torn.jsonl.torn-1").read_bytes() == torn  # the torn bytes set aside
    assert chat(again).status_code == 200
    records = read_journal(path)
    assert [r.completion_id for r in records] == ["torn-0", "torn-1", "torn-2"]
    assert [json.loads(line)["index"] for line in path.read_bytes().splitlines()] == [0, 1, 2]


def test_a_bad_line_in_the_middle_does_not_make_the_rest_unreadable(
    start_proxy: Callable[..., RunningProxy], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = start_proxy(journal_dir=tmp_path)
    session = first.new_session(session_id="bad", script=[{"content": "a"}, {"content": "b"}, {"content": "c"}])
    assert chat(session).status_code == 200 and chat(session).status_code == 200
    path = tmp_path / "bad.jsonl"
    one, two = path.read_bytes().splitlines(keepends=True)
    invalid = orjson.loads(one)
    invalid.update(index=7, completion_id="bad-7", response_ids="abc")  # JSON, but not a valid Completion
    garbage = one[: len(one) // 2] + two  # an old torn line with the next record glued on
    path.write_bytes(one + garbage + orjson.dumps(invalid) + b"\n" + two)
    with caplog.at_level(logging.WARNING, logger="polar.proxy.journal"):
        assert [c.index for c in read_journal(path)] == [0, 1]
        assert [c["index"] for c in session.completions()] == [0, 7, 1]  # the raw array keeps JSON records
        assert [c.index for c in first.state.get_completions("bad")] == [0, 1]
    assert "line 2 is not a completion record" in caplog.text and "not a valid Completion" in caplog.text
    assert first.http.delete("/sessions/bad").status_code == 200
    second = start_proxy(journal_dir=tmp_path)
    again = second.new_session(session_id="bad", script=[{"content": "z"}])
    assert chat(again).status_code == 200
    assert read_journal(path)[-1].completion_id == "bad-8"  # after the largest index on disk


def test_a_client_that_left_is_marked(start_proxy: Callable[..., RunningProxy], upstream: Upstream) -> None:
    running = vllm_proxy(start_proxy, upstream)
    session = running.new_session()
    upstream.actions.append("hang")
    host, port = running.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "left"}]}).encode()
    head = (
        f"POST /s/{session.session_id}/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {session.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + body)
        while upstream.requests == 0:  # the call reached the backend
            running.run(_tick())
    upstream.actions.insert(0, ("json", 200, vllm_answer("late"), None))
    upstream.release()  # the hung attempt ends with a 503; the retry gets the answer, for nobody
    for _ in range(500):
        if session.completions():
            break
        running.run(_tick())
    [record] = session.completions()
    assert record["metadata"]["delivery"] == "client_gone" and record["response_message"]["content"] == "late"
    assert chat(session, "next").status_code == 200
    assert [r["metadata"]["delivery"] for r in session.completions()] == ["client_gone", "answered"]


async def _tick() -> None:
    import asyncio

    await asyncio.sleep(0.01)


def test_a_small_line_is_written_without_a_thread_and_every_line_keeps_call_order(tmp_path: Path) -> None:
    """A small line, with nothing else being written, is on disk before ``append_async`` first yields (a worker
    thread's round trip costs more than the write); big lines go to a thread, and small ones queued behind them wait
    their turn."""
    journal = Journal(tmp_path / "s.jsonl")

    def record(index: int, pad: str = "") -> dict[str, Any]:
        return {"completion_id": f"s-{index}", "session_id": "s", "index": index, "pad": pad}

    step = journal.append_async(record(0))
    with pytest.raises(StopIteration):
        step.send(None)  # finished without suspending
    assert [orjson.loads(line)["index"] for line in journal.read_raw()] == [0]

    async def mixed() -> None:
        big = "x" * (INLINE_BYTES + 1)
        await asyncio.gather(*(journal.append_async(record(i, big if i % 3 == 1 else "")) for i in range(1, 10)))
        await journal.aclose()

    asyncio.run(mixed())
    assert [orjson.loads(line)["index"] for line in read_raw(journal.path)] == list(range(10))


def test_after_a_slow_write_on_the_loop_writes_go_to_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk under writeback pressure stalls a write on the event loop once, not every session's every call."""
    monkeypatch.setattr(journal_module, "SLOW_WRITE_S", 0.0)  # every write counts as slow
    monkeypatch.setattr(Journal, "_offload_until", 0.0)  # and is forgotten after this test
    journal = Journal(tmp_path / "s.jsonl")
    first = journal.append_async({"completion_id": "s-0", "session_id": "s", "index": 0})
    with caplog.at_level(logging.WARNING, "polar.proxy.journal"), pytest.raises(StopIteration):
        first.send(None)  # written on the loop, and found slow
    assert "writing in worker threads" in caplog.text
    write, threads = journal._write, []

    def spy(line: bytes) -> None:
        threads.append(threading.current_thread())
        write(line)

    monkeypatch.setattr(journal, "_write", spy)

    async def in_a_thread() -> None:
        assert await journal.append_async({"completion_id": "s-1", "session_id": "s", "index": 1}) > 0
        await journal.aclose()

    asyncio.run(in_a_thread())
    assert threads and threads[0] is not threading.main_thread()
    assert [orjson.loads(line)["index"] for line in read_raw(journal.path)] == [0, 1]
