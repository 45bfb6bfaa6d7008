"""The start-up backend check tells a dead backend from a busy one, against real HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from polar_cli.backoff import Backoff
from polar_cli.commands import backend_options
from polar_cli.errors import BackendBusy, BackendError, ConfigError
from polar_cli.gateway.backend_check import check_backend
from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.proxy import ProxyConfig
from polar_cli.proxy.backends.http import HttpBackendConfig
from polar_cli.proxy.backends.vllm import VllmClient

FAST = Backoff(initial_s=0.1, max_s=0.2, timeout_s=0.5)  # each probe waits 0.5 s for its answer
MODELS = {"object": "list", "data": [{"id": "served-model", "object": "model"}]}
Answer = Callable[[int], web.StreamResponse | None]  # the n-th probe (1-based) → its answer; None: the models list


@asynccontextmanager
async def backend(answer: Answer, *, ready_after_s: float = 0.0) -> AsyncIterator[tuple[str, list[int]]]:
    """A server whose ``GET /v1/models`` holds every request until ``ready_after_s`` after start, then answers;
    yields its URL and the list of probes it got (their numbers)."""
    probes: list[int] = []
    ready_at = time.monotonic() + ready_after_s

    async def models(request: web.Request) -> web.StreamResponse:
        probes.append(len(probes) + 1)
        await asyncio.sleep(max(0.0, ready_at - time.monotonic()))
        return answer(len(probes)) or web.json_response(MODELS)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", probes
    finally:
        await runner.cleanup()


async def check(url: str, wait_s: float) -> None:
    client = VllmClient(HttpBackendConfig(url=url))
    try:
        await check_backend(client, wait_s=wait_s, retry=FAST)
    finally:
        await client.close()


def ok(n: int) -> None:
    return None


def test_a_slow_backend_is_waited_for_and_the_wait_is_said(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[int]:
        async with backend(ok, ready_after_s=1.5) as (url, probes):
            await check(url, wait_s=30)
            return probes

    with caplog.at_level(logging.WARNING, logger="polar_cli.gateway.backend_check"):
        probes = asyncio.run(scenario())
    assert len(probes) >= 2  # the first probes timed out after connecting; a later one got the answer
    notes = [r.getMessage() for r in caplog.records if r.name == "polar_cli.gateway.backend_check"]
    assert len(notes) == 1
    assert notes[0].startswith("waiting up to 30 s for a busy backend: the vllm backend at http://127.0.0.1:")
    assert "does not answer: SocketTimeoutError" in notes[0]  # it took the connection, then was slow


def test_a_loading_backend_answering_503_is_waited_for() -> None:
    def loading(n: int) -> web.Response | None:
        return web.json_response({"error": {"message": "model is loading"}}, status=503) if n <= 2 else None

    async def scenario() -> list[int]:
        async with backend(loading) as (url, probes):
            await check(url, wait_s=30)
            return probes

    assert asyncio.run(scenario()) == [1, 2, 3]


def test_a_backend_busy_past_the_budget_fails_naming_the_wait() -> None:
    async def scenario() -> None:
        async with backend(ok, ready_after_s=60) as (url, _):
            await check(url, wait_s=1)

    with pytest.raises(BackendError, match=r"does not answer: .*still busy after 1 s, --backend-check-timeout") as err:
        asyncio.run(scenario())
    assert not isinstance(err.value, BackendBusy)
    assert "\n" not in str(err.value)


def test_a_closed_port_fails_at_once_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the test asks it
    url = f"http://127.0.0.1:{port}"
    with caplog.at_level(logging.WARNING, logger="polar_cli.gateway.backend_check"), pytest.raises(BackendError) as err:
        asyncio.run(check(url, wait_s=120))
    assert not isinstance(err.value, BackendBusy)
    message = str(err.value)
    assert message.startswith(f"the vllm backend at {url} does not answer: ClientConnectorError")
    assert "\n" not in message and "still busy" not in message
    assert not caplog.records  # no wait was announced: it was not retried


@pytest.mark.parametrize("status", [404, 401, 500])
def test_an_http_error_fails_at_once(status: int) -> None:
    def error(n: int) -> web.Response:
        return web.json_response({"error": {"message": "nope"}}, status=status)

    async def scenario() -> list[int]:
        async with backend(error) as (url, probes):
            with pytest.raises(BackendError, match=f"does not answer: .*HTTP {status}: nope") as err:
                await check(url, wait_s=120)
            assert not isinstance(err.value, BackendBusy)
            return probes

    assert asyncio.run(scenario()) == [1]  # asked once


@pytest.mark.parametrize("seconds", [0, -5])
def test_the_wait_must_be_positive(seconds: float) -> None:
    overrides = backend_options.proxy_overrides(backend="vllm", backend_url=["http://h"], backend_check_timeout=seconds)
    with pytest.raises(ConfigError, match="backend_check_timeout_s"):
        backend_options.proxy_config(overrides, source="polar run")


def test_the_wait_comes_from_the_flag() -> None:
    overrides = backend_options.proxy_overrides(backend="vllm", backend_url=["http://h"], backend_check_timeout=7)
    assert backend_options.proxy_config(overrides, source="polar run").backend_check_timeout_s == 7
    assert backend_options.proxy_config({}, source="polar run").backend_check_timeout_s == 120


def test_a_gateway_waits_as_long_as_its_proxy_config_says(tmp_path: Path) -> None:
    def loading(n: int) -> web.Response:
        return web.json_response({"error": {"message": "model is loading"}}, status=503)

    async def scenario() -> list[int]:
        async with backend(loading) as (url, probes):
            proxy = ProxyConfig(backend="vllm", backend_url=url, backend_check_timeout_s=1)
            node = GatewayNode(GatewayConfig(port=0, data_dir=tmp_path, proxy=proxy, backend_check="fail"))
            try:
                with pytest.raises(BackendError, match=r"HTTP 503: model is loading \(still busy after 1 s"):
                    await node.start()
            finally:
                await node.proxy.close()
            return probes

    assert len(asyncio.run(scenario())) >= 2  # asked again before giving up
