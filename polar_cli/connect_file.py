"""The connect file: how gateways on other hosts find the rollout server without its token on a command line (where
``ps`` and ``squeue`` would show it).

``polar serve --role server --connect-file PATH`` writes ``{url, token}`` to PATH (mode 0600, replaced atomically)
once it listens: ``url`` is where other hosts reach it (``server.public_url``; on a wildcard host, this host's name).
``polar serve --role gateway --connect-file PATH`` waits for the file (a gateway job may start before the server
job) and registers with what it says. PATH is in a folder both sides see (a shared filesystem under Slurm).
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from pydantic import ValidationError

from polar_cli.errors import ConfigError, ServiceUnavailableError
from polar_cli.models import StrictModel
from polar_cli.web.listen import listen_url, with_port

POLL_S = 0.5


class ServerAddress(StrictModel):
    """What a connect file holds."""

    url: str
    token: str


def advertised_url(host: str, port: int, public_url: str | None) -> str:
    """The server's URL as other hosts reach it: ``public_url`` (without a port: the bound one), else on a wildcard
    host this host's name, else where it listens."""
    if public_url:
        return with_port(public_url, port).rstrip("/")
    if host in ("0.0.0.0", "", "::"):
        return f"http://{socket.gethostname()}:{port}"
    return listen_url(host, port)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, mode 0600 from the start, replaced at once (a reader never sees half a file): for
    files holding a token (the connect file, ``serve.json``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(partial, path)


def write(path: Path, address: ServerAddress) -> None:
    """Write ``address`` to ``path`` (:func:`write_private`)."""
    write_private(path, address.model_dump_json())


def read(path: Path) -> ServerAddress | None:
    """The address in ``path``; None while there is no such file. ConfigError when it holds something else."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the connect file {path}: {exc.strerror or exc}") from exc
    try:
        return ServerAddress.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"{path} is not a rollout server's connect file ({exc.error_count()} errors)") from exc


async def wait_for(path: Path, within: float) -> ServerAddress:
    """The address in ``path``, waiting up to ``within`` seconds for the server to write it."""
    clock = asyncio.get_running_loop()
    deadline = clock.time() + within
    while True:
        address = read(path)
        if address is not None:
            return address
        if clock.time() >= deadline:
            raise ServiceUnavailableError(
                f"no rollout server wrote the connect file {path} within {within:g} s: start the server with "
                f"--connect-file {path}, in a folder this host sees too"
            )
        await asyncio.sleep(POLL_S)
