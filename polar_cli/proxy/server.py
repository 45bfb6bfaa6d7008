"""Running the proxy standalone (``polar proxy``): bind, report the URL, serve until cancelled, clean up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from polar_cli.errors import ProxyError
from polar_cli.http import app_runner
from polar_cli.proxy.app import create_proxy_app
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.state import ProxyState


def listen_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"


async def serve_proxy(config: ProxyConfig, on_ready: Callable[[ProxyState], None] | None = None) -> None:
    """Serve until cancelled (Ctrl-C); ``on_ready`` gets the state once listening (``state.base_url`` is set)."""
    state = ProxyState(config)
    runner = app_runner(create_proxy_app(config, state), handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        try:
            await site.start()
        except OSError as exc:
            raise ProxyError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
        port = runner.addresses[0][1]
        state.base_url = state.base_url or listen_url(config.host, port)
        if on_ready is not None:
            on_ready(state)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
