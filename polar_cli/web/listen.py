"""``listen(app, host, port)``: how every server Polar starts binds and serves (the proxy, a gateway node, the rollout
server, the doctor's proxy): HTTP-parser errors in the app's error shape, client-gone detection, a one-line error when
the address cannot be bound, and a short graceful shutdown.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from polar_cli.errors import ConfigError
from polar_cli.web.parser_errors import app_runner

SHUTDOWN_TIMEOUT_S = 2.0
"""How long a stop waits for requests still being answered before it cancels them, and then for the cancelled ones
to end (aiohttp's default is 60 s, twice): a long poll (``?wait=``) or a stream never holds a stop. The rollout
server also answers its long polls at once when it stops (its ``on_shutdown`` hook)."""


def listen_url(host: str, port: int) -> str:
    """The URL a local client reaches ``host:port`` at (a wildcard host is reached on 127.0.0.1)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"


def with_port(url: str, port: int) -> str:
    """``url`` with ``port`` added when it names none (``http://node017`` → ``http://node017:8790``): a public URL given
    before the port is bound (``port=0``, several servers on one host) still says where this one is."""
    parts = urlsplit(url)
    if parts.port is not None or not parts.hostname:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.netloc}:{port}"))


@dataclass
class Listener:
    """A served app: ``port`` is the bound one (``port=0`` picks a free one); ``url``, where a local client reaches
    it."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return listen_url(self.host, self.port)

    async def close(self) -> None:
        """Stop listening, answer (or after SHUTDOWN_TIMEOUT_S cancel) the requests under way, run the app's cleanup."""
        await self.runner.cleanup()


async def listen(
    app: web.Application,
    host: str,
    port: int,
    *,
    access_log: bool = False,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
) -> Listener:
    """Serve ``app`` on ``host:port`` until :meth:`Listener.close`. ConfigError (one line) when the address cannot be
    bound: the port is taken, the host is not this machine's, or binding it is not allowed. ``access_log``: log each
    request on the ``aiohttp.access`` logger (``polar proxy --verbose``)."""
    options = {} if access_log else {"access_log": None}
    runner = app_runner(app, handle_signals=False, shutdown_timeout=shutdown_timeout, **options)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(_bind_message(host, port, exc)) from exc
    return Listener(runner, host, int(runner.addresses[0][1]))


def _bind_message(host: str, port: int, exc: OSError) -> str:
    where = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where}: the port is already in use (stop what holds it, or choose another port)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges)"
    return f"{where}: {exc.strerror or exc}"
