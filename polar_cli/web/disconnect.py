"""Client-gone detection: a streaming handler stops its upstream the moment its client hangs up, not at its next
write."""

from __future__ import annotations

import asyncio

from aiohttp import web

GONE: web.RequestKey[asyncio.Event] = web.RequestKey("polar_client_gone", asyncio.Event)
"""The request's client-gone event, once :func:`client_gone` made one; the connection sets it when it is lost."""


def client_left(request: web.BaseRequest) -> bool:
    """Whether ``request``'s client has hung up by now (its transport is gone or closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def client_gone(request: web.BaseRequest) -> asyncio.Event:
    """Set once ``request``'s client has hung up: at once when it already has, else when its connection is lost
    (on a server started with :func:`polar_cli.web.listen.listen`; elsewhere only a request whose client left before
    this call)."""
    gone = request.get(GONE)
    if gone is None:
        gone = request[GONE] = asyncio.Event()
        if client_left(request):
            gone.set()
    return gone
