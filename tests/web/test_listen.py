"""``listen()``, the one way every Polar server binds: parser errors shaped on every server (the rollout server's were
text/plain), one line when the port is taken, and a stop that no long poll holds."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from polar_cli.errors import ConfigError
from polar_cli.web.listen import SHUTDOWN_TIMEOUT_S, listen
from tests.proxy.test_hardening import provider_of, raw_request

from .conftest import Served

REPO = Path(__file__).resolve().parents[2]


def test_http_parser_errors_are_json_in_the_control_shape_on_every_server(served: Served) -> None:
    bad_header = f"POST {served.create} HTTP/1.1\r\nHost: x\r\nBad\x01Header: 1\r\nContent-Length: 2\r\n\r\n{{}}"
    status, headers, body = raw_request(served.url, bad_header.encode())
    assert status == 400 and headers["content-type"].startswith("application/json"), body[:300]
    assert provider_of(json.loads(body)) == "control"
    assert "malformed HTTP request" in json.loads(body)["error"]["message"]


def test_a_taken_port_is_one_clear_line() -> None:
    async def body() -> None:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            with pytest.raises(ConfigError, match=rf"cannot listen on 127\.0\.0\.1:{port}: the port is already in use"):
                await listen(web.Application(), "127.0.0.1", port)

    asyncio.run(body())


def test_polar_serve_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = [sys.executable, "-m", "polar_cli", "serve", "--role", "server", "--port", str(port),
                "--data-dir", str(tmp_path)]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: the port is already in use (stop what holds it, or choose "
        "another port)"
    ]


def test_a_stop_is_not_held_by_a_request_still_waiting() -> None:
    async def long_poll(request: web.Request) -> web.Response:
        await asyncio.sleep(600)
        return web.Response()

    async def body() -> float:
        app = web.Application()
        app.router.add_get("/wait", long_poll)
        listener = await listen(app, "127.0.0.1", 0)
        _reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)  # the handler is waiting
        started = time.monotonic()
        await listener.close()
        writer.close()
        return time.monotonic() - started

    assert SHUTDOWN_TIMEOUT_S <= 5
    assert asyncio.run(body()) < 2 * SHUTDOWN_TIMEOUT_S + 1.5  # the wait, then the wait for the cancelled handler
