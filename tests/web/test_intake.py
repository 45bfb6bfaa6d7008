"""What every server does with a request before a handler reads its body (``polar_cli.web.intake``), on each kind of
real server (the proxy, a gateway node, the rollout server): a token before the body, a Content-Encoding it cannot
decode refused, a client's errors logged as one line and never as an internal error."""

from __future__ import annotations

import json
import logging
import socket

import httpx
import pytest

from tests.proxy.test_hardening import raw_request

from .conftest import Served
from .test_body import control_error, listings_answer


def _head(served: Served, length: int, *, token: bool = True, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {served.token}\r\n" if token else ""
    return (f"POST {served.create} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n{extra}"
            f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip


def _client_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "client error" in r.getMessage()]


def _no_internal_errors(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing the web layer (or aiohttp's server) logged is an error or carries a traceback (a session the gateway
    runs meanwhile may log its own)."""
    web = [r for r in caplog.records if r.name.startswith(("polar.web", "aiohttp"))]
    bad = [r for r in web if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [(r.levelname, r.getMessage()[:200]) for r in bad]


@pytest.mark.parametrize("encoding", ["compress", "x-made-up", "gzip, gzip", "br, gzip"])
def test_an_unknown_content_encoding_is_a_415_not_read_as_identity(served: Served, encoding: str) -> None:
    """Was a 201: aiohttp reads a body in a coding it does not know as identity."""
    body = json.dumps(served.make_body(f"enc-{len(encoding)}", {})).encode()
    with served.client() as client:
        before = served.count(client)
        resp = client.post(served.create, content=body, headers={"Content-Encoding": encoding})
        message = control_error(resp, 415)
        assert "Content-Encoding" in message and "gzip" in message, message
        assert resp.headers.get("connection", "").lower() == "close"  # the body was never read
        assert served.count(client) == before
        listings_answer(served, client)


def test_a_known_content_encoding_still_reads(served: Served) -> None:
    import gzip

    body = gzip.compress(json.dumps(served.make_body("gzipped", {})).encode())
    with served.client(**{"Content-Encoding": "gzip"}) as client:
        resp = client.post(served.create, content=body)
        assert resp.status_code in (200, 201), resp.text[:300]


def test_invalid_json_without_a_token_is_a_401(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as stranger:
        resp = stranger.post(served.create, content=b"{not json")
    assert "token" in control_error(resp, 401)


def test_a_large_body_without_a_token_is_refused_unread(served: Served) -> None:
    """The 401 comes before the body, and the connection closes: the rest of it is never read."""
    status, headers, body = raw_request(served.url, _head(served, 100 * 2**20, token=False) + b"{" * 65536)
    assert status == 401, body[:300]
    assert headers.get("connection", "").lower() == "close", headers
    assert "token" in json.loads(body)["error"]["message"]


def test_cut_body_and_bad_json_are_client_errors_of_one_line(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A cut body was logged at ERROR as an internal error with a traceback; refusals are INFO lines now."""
    caplog.set_level(logging.INFO)
    host, port = httpx.URL(served.url).host, httpx.URL(served.url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(_head(served, 1000) + b'{"cut": ')
    with served.client() as client:
        assert control_error(client.post(served.create, content=b"{nope"), 400)
        assert control_error(client.post(served.create, json={"unknown_field_x": 1}), 400)
        listings_answer(served, client)  # also lets the cut request's handler finish
    status, _, _ = raw_request(served.url, b"GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
    assert status == 400
    logged = [r.getMessage() for r in _client_errors(caplog)]
    assert any("before the body ended" in m for m in logged), logged
    assert any("not valid JSON" in m for m in logged), logged
    assert any("malformed HTTP request" in m for m in logged), logged
    assert all("\n" not in m for m in logged), logged
    assert all(r.levelno == logging.INFO and not r.exc_info for r in _client_errors(caplog))
    _no_internal_errors(caplog)
