"""Hostile input on the HTTP routes of a real ``polar serve`` (the rollout server and its gateway node in one process,
the scripted backend): a token before the body, an unknown Content-Encoding, a cut or oversized body, a pool that
cannot reload. Each answer is a 4xx in the route's own shape; the server keeps answering ``/healthz`` within a second,
its RSS stays bounded, nothing is logged as an internal error, and sessions still run afterwards."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.models.limits import MAX_CONTROL_BODY_BYTES
from tests.proxy.test_hardening import raw_request
from tests.server.procs import Serve, serve_config, waiting_task

MIB = 1 << 20


@dataclass
class Served:
    info: dict[str, Any]
    proc: Serve

    @property
    def pid(self) -> int:
        return int(self.proc.proc.pid)

    def url(self, side: str) -> str:
        return str(self.info["url"] if side == "server" else self.info["gateway_url"])

    def token(self, side: str) -> str:
        return str(self.info["token"] if side == "server" else self.info["node_token"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hostile")
    proc = Serve(root / "polar-data", "--port", "0", "--verbose", "--config", str(serve_config(root, "serve")))
    try:
        yield Served(asyncio.run(proc.ready()), proc)
    finally:
        proc.stop()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def still_healthy(served: Served, rss_before: float, grew_at_most_mib: float) -> None:
    """``/healthz`` answers within a second on both sides, the RSS grew by at most ``grew_at_most_mib``, and nothing
    was logged as an error (the server runs ``--verbose``: warnings and above reach its stderr)."""
    for side in ("server", "gateway"):
        with httpx.Client(base_url=served.url(side), timeout=1.0) as stranger:
            assert stranger.get("/healthz").json() == {"ok": True}
    assert rss_mib(served.pid) - rss_before <= grew_at_most_mib, (rss_before, rss_mib(served.pid))
    logged = served.proc.stderr()
    assert "Traceback" not in logged and "ERROR" not in logged and "internal" not in logged, logged[-2000:]


def error_of(status: int, reply: httpx.Response | tuple[int, dict[str, str], bytes], expected: int) -> str:
    """The message of a reply in the control error shape with status ``expected``."""
    if isinstance(reply, httpx.Response):
        got, content_type, body = reply.status_code, reply.headers["content-type"], reply.content
    else:
        got, content_type, body = reply[0], reply[1]["content-type"], reply[2]
    assert got == expected, body[:500]
    assert content_type.startswith("application/json"), content_type
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type"}, error
    return str(error["message"])


BODY_ROUTES = [
    ("server", "POST", "/rollout/task/submit"),
    ("server", "POST", "/nodes/register"),
    ("server", "POST", "/nodes/{node_id}/heartbeat"),
    ("server", "POST", "/callbacks/session_result"),
    ("server", "POST", "/inference/pause"),
    ("server", "POST", "/inference/resume"),
    ("server", "POST", "/inference/load_weights"),
    ("server", "POST", "/inference/backends"),
    ("server", "DELETE", "/inference/backends"),
    ("server", "POST", "/inference/cancel_stale"),
    ("gateway", "POST", "/sessions"),
    ("gateway", "POST", "/sessions/batch"),
    ("gateway", "POST", "/inference/pause"),
    ("gateway", "POST", "/inference/load_weights"),
    ("gateway", "DELETE", "/inference/backends"),
    ("gateway", "POST", "/proxy/sessions"),
]


@pytest.mark.parametrize(("side", "method", "path"), BODY_ROUTES)
def test_invalid_json_without_a_token_is_a_401(served: Served, side: str, method: str, path: str) -> None:
    """``POST /callbacks/session_result`` answered 400: it parsed the body before checking the token."""
    before = rss_mib(served.pid)
    target = path.format(node_id=served.info["node_id"])
    with httpx.Client(base_url=served.url(side), timeout=30) as stranger:
        reply = stranger.request(method, target, content=b"{not json")
        assert "token" in error_of(401, reply, 401)
        wrong = stranger.request(method, target, content=b"{not json", headers={"Authorization": "Bearer nope"})
        assert "token" in error_of(401, wrong, 401)
    still_healthy(served, before, 16)


@pytest.mark.parametrize(("side", "path"), [("server", "/callbacks/session_result"), ("server", "/rollout/task/submit"),
                                            ("gateway", "/sessions/batch")])  # fmt: skip
def test_a_100_mib_body_without_a_token_is_refused_unread(served: Served, side: str, path: str) -> None:
    """Was 300 MB and 1.6 s of reading and parsing before the 401 on ``POST /callbacks/session_result``."""
    before = rss_mib(served.pid)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {100 * MIB}\r\n\r\n"
    status, headers, body = raw_request(served.url(side), head.encode() + b'{"node_id": "' + b"x" * 65536)
    assert "token" in error_of(status, (status, headers, body), 401)
    assert headers.get("connection", "").lower() == "close"  # the other 100 MiB are never read
    still_healthy(served, before, 16)


@pytest.mark.parametrize(
    ("side", "path", "body"),
    [
        ("server", "/rollout/task/submit", waiting_task("encoded", 1)),
        ("server", "/inference/pause", {}),
        ("gateway", "/sessions/batch", {"tasks": [], "sessions": []}),
        ("gateway", "/inference/pause", {}),
    ],
)
@pytest.mark.parametrize("encoding", ["x-unknown", "compress", "gzip, identity"])
def test_an_unknown_content_encoding_is_a_415(served: Served, side: str, path: str, body: Any, encoding: str) -> None:
    """Was read as identity and answered 200."""
    before = rss_mib(served.pid)
    headers = {"Authorization": f"Bearer {served.token(side)}"}
    with httpx.Client(base_url=served.url(side), timeout=30) as http:
        encoded = {**headers, "Content-Encoding": encoding}
        reply = http.post(path, content=json.dumps(body).encode(), headers=encoded)
        assert "Content-Encoding" in error_of(415, reply, 415)
        if side == "server":
            assert http.get("/rollout/task/encoded", headers=headers).status_code == 404  # nothing was submitted
            assert http.get("/inference", headers=headers).json()["paused"] is None
        else:
            assert http.get("/inference", headers=headers).json()["paused"] is None
    still_healthy(served, before, 16)


@pytest.mark.parametrize(("side", "path"), [("server", "/inference/pause"), ("gateway", "/inference/resume"),
                                            ("server", "/nodes/register")])  # fmt: skip
def test_a_body_over_its_routes_limit_is_a_413(served: Served, side: str, path: str) -> None:
    """Each route reads at most its own limit (an /inference body: 1 MiB), with or without Content-Length."""
    before = rss_mib(served.pid)
    auth = f"Authorization: Bearer {served.token(side)}\r\n"
    limit = MAX_CONTROL_BODY_BYTES if path.startswith("/inference") else 64 * MIB
    declared = f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {limit + 1}\r\n\r\n"
    reply = raw_request(served.url(side), declared.encode() + b"{")
    assert f"limit of {limit // MIB:g} MiB" in error_of(reply[0], reply, 413)
    if limit == MAX_CONTROL_BODY_BYTES:  # chunked: refused once the limit is read
        chunk = b'{"x": "' + b"a" * limit + b'"}'
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Transfer-Encoding: chunked\r\n\r\n{len(chunk):x}\r\n"
        reply = raw_request(served.url(side), head.encode() + chunk + b"\r\n0\r\n\r\n")
        assert "limit of 1 MiB" in error_of(reply[0], reply, 413)
    still_healthy(served, before, 32)


def test_a_body_dense_with_arrays_is_refused_before_it_is_parsed(served: Served) -> None:
    """2 MiB of ``[],`` in a task's metadata parse into about 100 MiB of lists: refused by a scan of the bytes."""
    before = rss_mib(served.pid)
    body = json.dumps(waiting_task("dense", 1)).encode()
    dense = body.replace(b'"metadata": {', b'"metadata": {"x": [' + b"[]," * (2 * MIB // 3) + b'[]], ', 1)
    assert len(dense) > 2 * MIB
    server = {"Authorization": f"Bearer {served.token('server')}"}
    with httpx.Client(base_url=served.url("server"), headers=server, timeout=30) as http:
        reply = http.post("/rollout/task/submit", content=dense)
        assert "more than one array or object per 16 bytes" in error_of(400, reply, 400)
        assert http.get("/rollout/task/dense").status_code == 404
    still_healthy(served, before, 16)


@pytest.mark.parametrize(("side", "path"), [("server", "/rollout/task/submit"), ("server", "/callbacks/session_result"),
                                            ("gateway", "/sessions")])  # fmt: skip
def test_a_cut_body_and_bad_json_are_not_internal_errors(served: Served, side: str, path: str) -> None:
    """A body the client cuts short was logged at ERROR as "internal error" with a traceback."""
    before = rss_mib(served.pid)
    token = served.info["node_token"] if path.startswith("/callbacks") else served.token(side)
    url = httpx.URL(served.url(side))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: 4096\r\n\r\n"
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head.encode() + b'{"cut": ')
    with httpx.Client(base_url=served.url(side), timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        assert "not valid JSON" in error_of(400, http.post(path, content=b"{nope"), 400)
        refused = http.post(path, json={"node_id": served.info["node_id"], "unknown_field": 1})
        assert "unknown_field" in error_of(400, refused, 400)
    reply = raw_request(served.url(side), f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n".encode())
    assert "malformed HTTP request" in error_of(reply[0], reply, 400)
    still_healthy(served, before, 16)


def test_a_gateways_load_weights_on_a_pool_that_cannot_reload_is_a_409_and_pauses_nothing(served: Served) -> None:
    """Was a 502 that left the scripted pool paused: every session on the node then waited."""
    before = rss_mib(served.pid)
    gateway = {"Authorization": f"Bearer {served.token('gateway')}"}
    with httpx.Client(base_url=served.url("gateway"), headers=gateway, timeout=60) as http:
        message = error_of(409, http.post("/inference/load_weights", json={"path": "/ckpt/step-1"}), 409)
        assert "cannot reload weights" in message and "nothing was paused" in message, message
        assert http.get("/inference").json()["paused"] is None
    server = {"Authorization": f"Bearer {served.token('server')}"}
    with httpx.Client(base_url=served.url("server"), headers=server, timeout=90) as http:
        assert http.get("/inference").json()["paused"] is None
        submitted = http.post("/rollout/task/submit", json=waiting_task("after-hostile", 2))
        assert submitted.status_code == 200, submitted.text[:500]
        status = http.get("/rollout/task/after-hostile", params={"wait": 60}).json()
    assert status["state"] == "completed", status
    still_healthy(served, before, 64)
