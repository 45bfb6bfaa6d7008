"""Running the proxy standalone (``polar proxy``): bind, report the URL, serve until cancelled, clean up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from polar_cli.proxy.app import create_proxy_app
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.state import ProxyState
from polar_cli.web.listen import listen


async def serve_proxy(config: ProxyConfig, on_ready: Callable[[ProxyState], None] | None = None) -> None:
    """Serve until cancelled (Ctrl-C); ``on_ready`` gets the state once listening (``state.base_url`` is set)."""
    state = ProxyState(config)
    listener = await listen(create_proxy_app(config, state), config.host, config.port, access_log=True)
    try:
        state.base_url = state.base_url or listener.url
        if on_ready is not None:
            on_ready(state)
        await asyncio.Event().wait()
    finally:
        await listener.close()
