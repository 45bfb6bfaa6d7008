"""``GET /metrics`` in the Prometheus text format: the route every server adds (behind its control token), and
``listen_metrics``, the operator's separate, unauthenticated metrics bind (``metrics.port``)."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from polar_cli.metrics import CONTENT_TYPE, Exposition, render_all
from polar_cli.web.errors import Handler, json_errors, json_response
from polar_cli.web.listen import Listener, listen


def metrics_handler(expositions: Sequence[Exposition]) -> Handler:
    """The handler answering ``expositions`` rendered together."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=await render_all(expositions), headers={"Content-Type": CONTENT_TYPE})

    return metrics


async def listen_metrics(expositions: Sequence[Exposition], host: str, port: int) -> Listener:
    """Serve ``GET /metrics`` (no token: bind it where only the scraper reaches) and ``GET /healthz`` alone."""
    app = web.Application(middlewares=[json_errors(what="metrics")])

    async def health(request: web.Request) -> web.Response:
        return json_response({"ok": True})

    app.router.add_get("/metrics", metrics_handler(expositions))
    app.router.add_get("/healthz", health)
    return await listen(app, host, port)
