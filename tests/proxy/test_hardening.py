"""Malformed input never gets a 5xx or a text/plain error: each case a fuzzer found, reproduced then fixed.

Every reply under ``/s/{session_id}`` is a success or a 4xx in the detected provider's JSON error shape (control
routes: the control shape), whether the codec, the proxy, aiohttp's router or aiohttp's HTTP parser refused it.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from polar_cli.errors import brief
from polar_cli.web.body import MAX_JSON_DEPTH
from polar_cli.web.parser_errors import _Framing, _split_request_line

from .conftest import ProxySession, RunningProxy

CHAT = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def provider_of(body: Any) -> str:
    """Which error shape a JSON error body has."""
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    error = body["error"]
    assert isinstance(error.get("message"), str), body
    if body.get("type") == "error":
        return "anthropic"
    if "status" in error and "code" in error:
        return "google"
    if "param" in error and "code" in error:
        return "openai"
    assert set(error) == {"message", "type"}, body
    return "control"


def assert_error(resp: httpx.Response, status: int, shape: str) -> str:
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert provider_of(body) == shape, body
    message: str = body["error"]["message"]
    return message


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def raw_request(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes to the server of ``url`` and read one HTTP reply (status, lower-case headers, body)."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split(" ")[1]), headers, body


def raw_error(url: str, data: bytes, status: int, shape: str) -> str:
    got, headers, body = raw_request(url, data)
    assert got == status, body[:300]
    assert headers["content-type"].startswith("application/json"), headers
    parsed = json.loads(body)
    assert provider_of(parsed) == shape, parsed
    message: str = parsed["error"]["message"]
    return message


def deep_chat(depth: int, where: str = "metadata") -> bytes:
    """An Anthropic body with a value nested ``depth`` deep (written by hand: json/orjson cannot write it)."""
    value = b"[" * depth + b'"x"' + b"]" * depth
    if where == "role":
        return b'{"model": "m", "max_tokens": 16, "messages": [{"role": ' + value + b', "content": "hi"}]}'
    return (
        b'{"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "metadata": ' + value + b"}"
    )


def path_of(session: ProxySession) -> str:
    return f"/s/{session.session_id}"


# ---- nesting, types, messages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300, 1000])
def test_too_deep_json_is_a_400_not_a_journal_failure(proxy: RunningProxy, depth: int) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    headers = {"x-api-key": session.api_key}
    resp = httpx.post(f"{session.anthropic_base}/v1/messages", content=deep_chat(depth), headers=headers)
    assert "nested deeper" in assert_error(resp, 400, "anthropic")
    ok = {**CHAT, "metadata": nested(MAX_JSON_DEPTH - 2)}  # at the limit it is accepted and journaled
    resp = httpx.post(f"{session.anthropic_base}/v1/messages", json=ok, headers={"x-api-key": session.api_key})
    assert resp.status_code == 200, resp.text
    assert len(session.completions()) == 1


@pytest.mark.parametrize("role", [["user"], {"a": 1}, 7, None])
@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "google"])
def test_a_non_string_role_is_a_400(proxy: RunningProxy, provider: str, role: Any) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    key = {"x-api-key": session.api_key, "x-goog-api-key": session.api_key}
    if provider == "openai_chat":
        url, body, shape = (
            f"{session.openai_base}/chat/completions",
            {"model": "m", "messages": [{"role": role}]},
            "openai",
        )
    elif provider == "openai_responses":
        url, shape = f"{session.openai_base}/responses", "openai"
        body = {"model": "m", "input": [{"type": role, "role": role, "content": "hi"}]}
    elif provider == "anthropic":
        url, body, shape = f"{session.anthropic_base}/v1/messages", {**CHAT, "messages": [{"role": role}]}, "anthropic"
    else:
        url, shape = f"{session.google_base}/v1beta/models/g:generateContent", "google"
        body = {"contents": [{"role": role, "parts": [{"text": "hi"}]}]}
    resp = httpx.post(url, json=body, headers=key)
    if role is None and provider == "google":
        assert resp.status_code == 200  # google: the role defaults to user
        return
    assert "role" in assert_error(resp, 400, shape) or "type" in resp.json()["error"]["message"]
    assert session.completions() == []


def test_error_messages_quote_values_briefly() -> None:
    deep = nested(5000)  # repr() of this raises RecursionError
    with pytest.raises(RecursionError):
        repr(deep)
    assert len(brief(deep)) <= 80
    assert len(brief("x" * 6_000_000)) <= 80
    assert len(brief({str(i): i for i in range(10_000)})) <= 80


def test_deep_role_gets_a_400_and_a_short_message(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    headers = {"x-api-key": session.api_key}
    resp = httpx.post(f"{session.anthropic_base}/v1/messages", content=deep_chat(1000, "role"), headers=headers)
    assert len(assert_error(resp, 400, "anthropic")) < 300
    huge_role = {**CHAT, "messages": [{"role": "u" * 1_000_000, "content": "hi"}]}
    resp = httpx.post(f"{session.anthropic_base}/v1/messages", json=huge_role, headers={"x-api-key": session.api_key})
    assert len(assert_error(resp, 400, "anthropic")) < 300


# ---- bodies -----------------------------------------------------------------------------------------------------


def test_gzip_content_encoding_on_a_plain_body_is_a_400(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    headers = {"Authorization": f"Bearer {session.api_key}", "Content-Encoding": "gzip"}
    resp = httpx.post(f"{session.openai_base}/chat/completions", content=json.dumps(CHAT).encode(), headers=headers)
    assert "body" in assert_error(resp, 400, "openai")
    assert session.completions() == []


def test_a_65_mb_body_is_a_413_in_the_provider_shape(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    size = 65 * 1024 * 1024
    head = (
        f"POST {path_of(session)}/v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {session.api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    message = raw_error(proxy.url, head + b"{" + b" " * 1000, 413, "anthropic")  # refused before the body is read
    assert "64 MiB" in message
    # without a Content-Length (chunked), the limit holds while reading: a proxy with a 1 MiB limit
    assert session.completions() == []


def test_a_chunked_body_over_the_limit_is_a_413(start_proxy: Callable[..., RunningProxy]) -> None:
    running = start_proxy(max_body_mb=1)
    session = running.new_session(script=[{"content": "ok"}])

    def chunks() -> Any:
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(3):
            yield b"x" * (1 << 20)
        yield b'"}]}'

    resp = httpx.post(
        f"{session.google_base}/v1beta/models/g:generateContent",
        content=chunks(),
        headers={"x-goog-api-key": session.api_key},
    )
    assert "1 MiB" in assert_error(resp, 413, "google")
    assert session.completions() == []


def test_a_non_utf8_api_key_is_a_401(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    body = json.dumps(CHAT).encode()
    for header in (b"x-api-key: \xff\xfe" + session.api_key.encode(), b"Authorization: Bearer \xc3\x28"):
        data = (
            f"POST {path_of(session)}/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
            + header
            + b"\r\n\r\n"
            + body
        )
        raw_error(proxy.url, data, 401, "anthropic")
    assert session.completions() == []


# ---- errors raised by aiohttp before any handler ---------------------------------------------------------------


def test_router_errors_are_json_in_the_right_shape(proxy: RunningProxy) -> None:
    assert_error(httpx.post(f"{proxy.url}/s/", json=CHAT), 404, "openai")  # no session id: the router's 404
    assert_error(httpx.post(f"{proxy.url}/s//v1/messages", json=CHAT), 404, "anthropic")
    assert_error(httpx.put(f"{proxy.url}/sessions", json={}), 405, "control")
    assert_error(httpx.get(f"{proxy.url}/nope"), 404, "control")
    session = proxy.new_session(script=[{"content": "ok"}])
    wrong_method = httpx.get(f"{session.anthropic_base}/v1/messages", headers={"x-api-key": session.api_key})
    assert_error(wrong_method, 404, "anthropic")


@pytest.mark.parametrize(
    ("target", "shape"),
    [
        ("/s/abc/v1/messages", "anthropic"),
        ("/s/abc/v1/chat/completions", "openai"),
        ("/s/abc/v1/responses", "openai"),
        ("/s/abc/v1beta/models/g:generateContent", "google"),
        ("/sessions", "control"),
    ],
)
def test_http_framing_errors_are_json_in_the_right_shape(proxy: RunningProxy, target: str, shape: str) -> None:
    bad_header = f"POST {target} HTTP/1.1\r\nHost: x\r\nBad\x01Header: 1\r\nContent-Length: 2\r\n\r\n{{}}".encode()
    assert "malformed HTTP request" in raw_error(proxy.url, bad_header, 400, shape)
    conflicting = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}"
    raw_error(proxy.url, conflicting.encode(), 400, shape)
    bad_chunks = f"POST {target} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
    got, headers, _ = raw_request(proxy.url, bad_chunks.encode())
    assert got == 400 or got == 401, got  # a bad chunk after the headers is the handler's (401: no key) or the parser's
    assert headers["content-type"].startswith("application/json")
    garbage = raw_error(proxy.url, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "control")
    assert "malformed" in garbage


def test_a_framing_error_on_a_kept_alive_connection_names_its_own_path(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    good = json.dumps(CHAT).encode()
    first = (
        f"POST {path_of(session)}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {session.api_key}\r\nContent-Length: {len(good)}\r\n\r\n"
    ).encode() + good
    second = f"POST {path_of(session)}/v1/messages HTTP/1.1\r\nHost: x\r\nBad\x01: 1\r\n\r\n".encode()
    with socket.create_connection((httpx.URL(proxy.url).host, httpx.URL(proxy.url).port), timeout=30) as sock:
        sock.sendall(first)
        received = b""
        while b'"object":"chat.completion"' not in received:
            received += sock.recv(65536)
        sock.sendall(second)
        rest = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    assert rest.startswith(b"HTTP/1.") and rest[9:12] == b"400", rest[:200]
    assert provider_of(json.loads(rest.partition(b"\r\n\r\n")[2])) == "anthropic"


def read_replies(sock: socket.socket) -> list[tuple[int, dict[str, str], bytes]]:
    """Every HTTP reply on ``sock`` until the server closes it (or it stays silent for the socket's timeout)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        pass
    replies = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        replies.append((int(lines[0].split(" ")[1]), headers, rest[:length]))
        received = rest[length:]
    return replies


def read_one_reply(sock: socket.socket) -> tuple[int, bytes]:
    """One reply on a kept-alive connection (status, body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, received
        body += chunk
    assert len(body) == length, body  # nothing more than this one reply
    return int(head.split(b" ")[1]), body


def connect(proxy: RunningProxy, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection((httpx.URL(proxy.url).host, httpx.URL(proxy.url).port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_framing_names_every_request_line_across_bodies(step: int) -> None:
    """What the server knows of the request lines on a connection, however the bytes are cut into chunks."""
    stream = (
        b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nGET /"
        b"\r\nPOST /b HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        b"3;x=1\r\nPUT\r\n2\r\n\r\n\r\n0\r\nX-Trailer: 1\r\n\r\n"
        b"DELETE /c?k=v HTTP/1.1\r\nHost: x\r\n\r\n"
        b"PATCH /d-still-arrivi"
    )
    framing = _Framing()
    for at in range(0, len(stream), step):
        framing.feed(stream[at : at + step])
    named = [_split_request_line(framing.line(i)) for i in range(4)]
    assert named == [("POST", "/a"), ("POST", "/b"), ("DELETE", "/c?k=v"), ("PATCH", "/d-still-arrivi")]
    assert _split_request_line(framing.line(9)) == ("UNKNOWN", "/")


def test_a_deflate_body_that_does_not_end_its_stream_is_answered_once(proxy: RunningProxy) -> None:
    """``{}`` under ``Content-Encoding: deflate`` inflates without an error but never ends its stream: aiohttp's
    parser raises only once the whole body is in. When the body arrives after the head (the handler already waits
    for it), that error used to be queued as a request of its own behind the handler, which waited forever."""
    session = proxy.new_session(script=[{"content": "ok"}])
    head = (
        f"POST {path_of(session)}/v1beta/models/g:countTokens HTTP/1.1\r\nHost: x\r\n"
        f"x-goog-api-key: {session.api_key}\r\nContent-Type: application/json\r\nContent-Encoding: deflate\r\n"
        "Content-Length: 2\r\n\r\n"
    ).encode()
    for parts in ([head + b"{}"], [head, b"{}"]):  # in one piece, then the body after the handler started
        with connect(proxy) as sock:
            for part in parts:
                sock.sendall(part)
                time.sleep(0.3)
            replies = read_replies(sock)  # the server closes the connection after its one answer
        assert len(replies) == 1, replies
        status, headers, body = replies[0]
        assert status == 400 and headers["content-type"].startswith("application/json"), (status, body)
        assert provider_of(json.loads(body)) == "google", body
    assert session.completions() == []


def test_a_parser_error_after_a_body_in_the_same_chunk_names_its_own_path(proxy: RunningProxy) -> None:
    """A request answered before its body arrived (a models listing that never reads it; a refusal would close the
    connection instead): the client's next request then comes in the same chunk as that body,
    ``...}POST /s/...``. A parser error in it (brotli is not installed) is answered in the shape of its own path, not
    of the request before it."""
    session = proxy.new_session(script=[{"content": "ok"}])
    body = b'{"max_tokens": {}}'
    first = (f"GET {path_of(session)}/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {session.api_key}\r\n"
             f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    deep = b"[" * 1024 + b"]" * 1024
    second = (
        f"POST {path_of(session)}/v1beta/models/g:streamGenerateContent HTTP/1.1\r\nHost: x\r\n"
        f"x-goog-api-key: {session.api_key}\r\nContent-Type: application/json\r\nContent-Encoding: br\r\n"
        f"Content-Length: {len(deep)}\r\n\r\n"
    ).encode() + deep
    with connect(proxy) as sock:
        sock.sendall(first.encode())
        status, reply = read_one_reply(sock)
        assert status == 200 and "data" in json.loads(reply), reply
        sock.sendall(body + second)
        replies = read_replies(sock)
    assert len(replies) == 1, replies
    status, headers, reply = replies[0]
    assert status == 400 and headers["content-type"].startswith("application/json"), reply
    assert provider_of(json.loads(reply)) == "google", reply
    assert "brotli" in json.loads(reply)["error"]["message"]


def test_a_bad_body_in_the_chunk_that_ends_the_previous_body_is_answered(proxy: RunningProxy) -> None:
    """The chunk that ends one request's body also holds the next request, whose deflate body is garbage: that
    request is still answered (in its shape, closing the connection), not dropped with the connection."""
    session = proxy.new_session(script=[{"content": "ok"}])
    body = b'{"parts": [{}, {}]}'
    first = (f"GET {path_of(session)}/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {session.api_key}\r\n"
             f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    garbage = b"\xa2[\x0e\x84\x05+\x1f"
    second = (
        f"POST {path_of(session)}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {session.api_key}\r\nContent-Encoding: deflate\r\n"
        f"Content-Length: {len(garbage)}\r\n\r\n"
    ).encode() + garbage
    with connect(proxy) as sock:
        sock.sendall(first.encode())
        assert read_one_reply(sock)[0] == 200  # answered before its body arrived (a refusal would close instead)
        sock.sendall(body + second)
        replies = read_replies(sock)
    assert len(replies) == 1, replies
    status, headers, reply = replies[0]
    assert status == 400 and headers["connection"] == "close", (headers, reply)
    assert provider_of(json.loads(reply)) == "openai", reply
    assert session.completions() == []


def test_a_parser_error_in_pipelined_requests_names_the_rejected_one(proxy: RunningProxy) -> None:
    """Two requests in one chunk, the first refused by the parser: its answer has the first one's shape."""
    session = proxy.new_session(script=[{"content": "ok"}])
    bad = (
        f"POST {path_of(session)}/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\n"
        "Content-Length: 2\r\n\r\n{}"
    )
    good = f"POST {path_of(session)}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}"
    with connect(proxy) as sock:
        sock.sendall((bad + good).encode())
        replies = read_replies(sock)
    assert len(replies) == 1, replies
    assert replies[0][0] == 400 and provider_of(json.loads(replies[0][2])) == "anthropic", replies


# ---- CPU-heavy work off the event loop ------------------------------------------------------------------------


def test_a_big_message_does_not_block_other_sessions(proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The big render is held in its worker thread until the small call has been answered: if it ran on the event
    loop, the small call could never be served and would time out."""
    big, small = proxy.new_session(script=[{"content": "big"}]), proxy.new_session(script=[{"content": "small"}])
    renderer = proxy.state.pool.clients()[0].renderer  # type: ignore[attr-defined]
    original = renderer.prompt_ids
    big_started, small_done = threading.Event(), threading.Event()

    def prompt_ids(messages: list[dict[str, Any]], tools: Any, limit: int | None = None) -> list[int]:
        if len(str(messages[-1].get("content"))) > 100_000:
            big_started.set()
            assert small_done.wait(timeout=30), "the small call was not served while the big one rendered"
        result: list[int] = original(messages, tools, limit)
        return result

    monkeypatch.setattr(renderer, "prompt_ids", prompt_ids)
    results: dict[str, int] = {}

    def call(session: ProxySession, content: str) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        headers = {"Authorization": f"Bearer {session.api_key}"}
        resp = httpx.post(f"{session.openai_base}/chat/completions", json=body, headers=headers, timeout=60)
        results[content[:5]] = resp.status_code

    worker = threading.Thread(target=call, args=(big, "word " * 30_000))  # 150 KB: within the prompt budget
    worker.start()
    assert big_started.wait(timeout=60)
    call(small, "hello")  # answered while the big render is still in its thread
    small_done.set()
    worker.join(timeout=60)
    assert results == {"hello": 200, "word ": 200}
    assert len(big.completions()) == 1 and len(small.completions()) == 1
