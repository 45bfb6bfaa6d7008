"""Fuzzing the provider endpoints: whatever a client sends, the proxy answers a success or a 4xx in the provider's
JSON error shape, journals nothing it refused, and still serves good requests afterwards.

In CI a small seeded, derandomized run; ``POLAR_FUZZ_EXAMPLES=10000`` runs that many examples per test (two tests:
HTTP requests built by hypothesis, and raw bytes on a socket) with fresh randomness:

    POLAR_FUZZ_EXAMPLES=10000 python -m pytest -q -p no:cacheprovider tests/proxy/test_fuzz.py
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
from typing import Any

import httpx
import openai
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import RunningProxy
from .test_hardening import provider_of

FUZZ_EXAMPLES = int(os.environ.get("POLAR_FUZZ_EXAMPLES") or 0)


def fuzz_settings(ci_examples: int) -> settings:
    return settings(
        max_examples=FUZZ_EXAMPLES or ci_examples,
        derandomize=not FUZZ_EXAMPLES,  # CI: the same examples every run
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# endpoint tail → (provider shape, a valid body)
ENDPOINTS: dict[str, tuple[str, dict[str, Any]]] = {
    "/v1/chat/completions": ("openai", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "/v1/responses": ("openai", {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}]}),
    "/v1/messages": ("anthropic", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    "/v1/messages/count_tokens": ("anthropic", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "/v1beta/models/g:generateContent": ("google", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
    "/v1beta/models/g:streamGenerateContent": ("google", {"contents": [{"parts": [{"text": "hi"}]}]}),
    "/v1beta/models/g:countTokens": ("google", {"contents": [{"parts": [{"text": "hi"}]}]}),
    "/v1/models": ("openai", {}),
    "/v1/embeddings": ("openai", {}),
}
GENERATE = {tail for tail in ENDPOINTS if tail.endswith(("completions", "responses", "messages", "Content"))}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["user", "assistant", "system", "model", "tool", "text", "function", "auto", "ANY", ""]),
)
FIELD_NAMES = [
    "role", "content", "type", "text", "messages", "input", "contents", "parts", "tools", "tool_choice", "system",
    "name", "arguments", "function", "tool_calls", "tool_call_id", "call_id", "output", "functionCall", "args",
    "functionResponse", "response", "systemInstruction", "generationConfig", "toolConfig", "max_tokens", "stream",
    "temperature", "stop", "instructions", "input_schema", "parameters", "thinking", "model", "id", "source", "x",
]  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELD_NAMES), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """``base`` with values replaced, inserted or deleted along a random path (or something else entirely)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    body: Any = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        node = body
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
            if not isinstance(node[key], (dict, list)):
                break
            node = node[key]
        if isinstance(node, dict):
            key = draw(st.sampled_from([*node, *FIELD_NAMES[:12]])) if node else draw(st.sampled_from(FIELD_NAMES))
            if key in node and draw(st.integers(0, 4)) == 0:
                del node[key]
            else:
                node[key] = draw(json_values)
        elif isinstance(node, list):
            node.append(draw(json_values)) if draw(st.booleans()) or not node else node.pop()
    return body


def deep(depth: int) -> bytes:
    return b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"


def content_headers(draw: st.DrawFn, raw: bytes) -> tuple[dict[str, str], bytes]:
    """A Content-Type, and a Content-Encoding or none: mostly one the body does not have, sometimes real gzip."""
    headers = {"Content-Type": draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form"]))}
    encoding = draw(st.sampled_from([None, None, None, "gzip", "deflate", "br", "zstd", "bogus", "gzip-real"]))
    if encoding == "gzip-real":
        raw, encoding = gzip.compress(raw), "gzip"
    if encoding:
        headers["Content-Encoding"] = encoding
    return headers, raw


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    tail = draw(st.sampled_from(sorted(ENDPOINTS)))
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]))
    kind = draw(st.integers(0, 9))
    if kind <= 6:
        raw = json.dumps(draw(mutated(ENDPOINTS[tail][1]))).encode()  # json: it writes ints past 64 bits
    elif kind == 7:
        raw = deep(draw(st.sampled_from([100, 127, 128, 129, 200, 254, 255, 256, 1023, 1024, 1025, 5000])))
    elif kind == 8:
        raw = draw(st.binary(max_size=64))
    else:
        raw = orjson.dumps(ENDPOINTS[tail][1])[: draw(st.integers(0, 40))]
    headers, raw = content_headers(draw, raw)
    return method, tail, headers, raw


def test_fuzz_provider_endpoints(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[])  # an empty script: every generation answers the final text
    prefix = f"{proxy.url}/s/{session.session_id}"
    key = session.api_key
    auth = {"x-api-key": key, "x-goog-api-key": key, "Authorization": f"Bearer {key}"}
    key_bytes = key.encode()
    generated = 0
    with httpx.Client(timeout=60) as client:

        @fuzz_settings(ci_examples=400)
        @given(requests(), st.sampled_from(["key", "key", "key", "none", "wrong", "odd"]))
        def check(request: tuple[str, str, dict[str, str], bytes], key: str) -> None:
            nonlocal generated
            method, tail, headers, raw = request
            sent: dict[str, str | bytes] = dict(headers)
            if key == "key":
                sent.update(auth)
            elif key == "wrong":
                sent["x-api-key"] = "wrong"
            elif key == "odd":
                sent["x-api-key"] = b"\xff\xfe" + key_bytes
            resp = client.request(method, prefix + tail, content=raw, headers=sent)
            assert resp.status_code < 500, (method, tail, raw[:200], resp.text[:300])
            if resp.status_code >= 400:
                assert resp.headers["content-type"].startswith("application/json"), resp.headers
                shape = provider_of(resp.json())
                if tail in ("/v1/models", "/v1/embeddings"):  # the headers name the provider
                    assert shape in ("anthropic", "google", "openai"), resp.text[:300]
                else:  # the path does
                    assert shape == ENDPOINTS[tail][0], (tail, resp.text[:300])
            elif method == "POST" and tail in GENERATE:
                generated += 1

        check()
    records = session.completions()
    assert len(records) == generated  # nothing journaled for a refused request, everything for an answered one
    # good requests are still answered correctly afterwards, by a real SDK
    good = proxy.new_session(script=[{"content": "still fine"}])
    with openai.OpenAI(base_url=good.openai_base, api_key=good.api_key, max_retries=0) as api:
        answer = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "still fine"
    assert len(good.completions()) == 1


# ---- raw bytes on a socket: what no HTTP client would send -----------------------------------------------------

request_lines = st.builds(
    lambda method, tail, version: f"{method} {tail} {version}\r\n".encode(),
    st.sampled_from(["POST", "GET", "PUT", "BREW", "P\x00ST", ""]),
    st.sampled_from(["/s/sid" + tail for tail in ENDPOINTS] + ["/sessions", "/", "/s/", "*", "/s/sid/v1/messages%zz"]),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 x", "", "http/1.1"]),
)
header_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [
                b"Host: x",
                b"Content-Length: 2",
                b"Content-Length: -1",
                b"Content-Length: 99999999999999999999",
                b"Transfer-Encoding: chunked",
                b"Transfer-Encoding: gzip, chunked",
                b"Content-Encoding: gzip",
                b"x-api-key: \xff\xfe",
                b"Authorization: Bearer \xc3(",
                b"Bad Header: 1",
                b"X-Ctl: \x01",
                b": empty-name",
                b" folded",
            ]
        ),
        st.binary(max_size=30).filter(lambda b: b"\r\n" not in b),
    ),
    max_size=5,
)


def send_raw(url: str, data: bytes) -> bytes:
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received


def test_fuzz_raw_http(proxy: RunningProxy) -> None:
    @fuzz_settings(ci_examples=150)
    @given(request_lines, header_lines, st.binary(max_size=40))
    def check(line: bytes, headers: list[bytes], body: bytes) -> None:
        data = line + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
        reply = send_raw(proxy.url, data)
        if not reply:
            return  # the connection closed without an answer (a body still awaited, then EOF): nothing to shape
        head, _, payload = reply.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        assert status < 500, (data, reply[:300])
        if status >= 400:
            assert b"content-type: application/json" in head.lower(), (data, reply[:300])
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            assert length is not None, reply[:300]
            provider_of(json.loads(payload[: int(length.group(1))]))

    check()
    # the server still answers a good request afterwards
    session = proxy.new_session(script=[{"content": "ok"}])
    resp = httpx.post(
        f"{session.openai_base}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {session.api_key}"},
    )
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "ok"
