"""Reaching the HuggingFace Hub through ``huggingface_hub`` and ``datasets`` without their retries and warnings
reaching the user.

Unreachable, those libraries retry each request for about 24 s, logging a warning a line, and then raise an error
several exceptions deep. Here: offline mode (``HF_HUB_OFFLINE``) is honoured, one quick request checks that the Hub
answers before a dataset is loaded from it, the libraries' loggers are kept to errors while Polar calls them, and
their connection and HTTP errors are said in a few words (``cause``). The Hub's address is theirs: ``HF_ENDPOINT``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import httpx

from polar_cli.errors import HubError

T = TypeVar("T")

DEFAULT_ENDPOINT = "https://huggingface.co"
TRUE = ("1", "on", "yes", "true")
PROBE_TIMEOUT = 5.0
"""Seconds the reachability check waits (connect and answer)."""
LIBRARY_LOGGERS = ("huggingface_hub", "datasets")
NETWORK_MODULES = ("httpx", "httpx2", "httpcore", "requests", "urllib3", "aiohttp")
"""Where the exceptions of a failed connection come from (huggingface_hub has used requests, httpx and httpx2)."""


def endpoint() -> str:
    """The Hub's address, as ``huggingface_hub`` reads it."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline(*, datasets: bool = False) -> bool:
    """Whether the user asked for offline mode: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` (``huggingface_hub``);
    for ``datasets``, ``HF_DATASETS_OFFLINE`` when it is set, else the same."""
    if datasets and (value := os.environ.get("HF_DATASETS_OFFLINE")) is not None:
        return value.strip().lower() in TRUE
    return any(os.environ.get(name, "").strip().lower() in TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def unreachable(timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why the Hub cannot be reached (``connection refused``, ``timed out after 5s``...), or None when it answers
    (any HTTP status: the library reports refusals itself). One request, no retries."""
    try:
        httpx.head(endpoint(), timeout=timeout)
    except httpx.TimeoutException:
        return f"timed out after {timeout:g}s"
    except httpx.HTTPError as exc:
        return cause(exc)
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def is_network_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a failed connection, a timeout or offline mode."""
    for item in _chain(exc):
        module = type(item).__module__.split(".")[0]
        if module in NETWORK_MODULES and not _http_status(item):
            return True
        if isinstance(item, ConnectionError | TimeoutError) or type(item).__name__ == "OfflineModeIsEnabled":
            return True
    return False


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status the Hub answered with, when ``exc`` comes from an HTTP error response."""
    return next((s for item in _chain(exc) if (s := _http_status(item)) is not None), None)


def cause(exc: BaseException) -> str:
    """A few words on why a call to the Hub failed: the innermost network error's first line (``[Errno 111]
    Connection refused``), or that offline mode is on; else ``exc``'s own first line (the library's message)."""
    for item in reversed(list(_chain(exc))):
        if type(item).__name__ == "OfflineModeIsEnabled":
            return "offline mode is on"
        module = type(item).__module__.split(".")[0]
        if module in NETWORK_MODULES and _http_status(item) is None:
            return _first_line(item)
    return _first_line(exc)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The libraries' loggers keep their retry notices and warnings to themselves while Polar calls them (their
    errors still come back as exceptions, which Polar maps to one line)."""
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def load_from_hub(load: Callable[[], T], *, name: str, local_copy: str) -> T:
    """``load()``, a ``datasets`` call that reads ``name`` from the Hub, quietly. When the Hub cannot be reached, or
    offline mode finds no cached copy, a one-line HubError within seconds that ends with ``local_copy`` (how to give
    the data as a local file instead: the dataset's option, with an example). Other errors propagate."""
    is_offline = offline(datasets=True)
    if not is_offline and (why := unreachable()) is not None:
        raise HubError(f"cannot reach the HuggingFace Hub at {endpoint()} ({why}) to load {name}; {local_copy}, "
                       "or set HF_HUB_OFFLINE=1 to use the datasets cache")  # fmt: skip
    try:
        with quiet():
            return load()
    except Exception as exc:
        if not is_network_error(exc):
            raise
        where = "in offline mode" if is_offline else f"from the HuggingFace Hub at {endpoint()}"
        raise HubError(f"cannot load {name} {where}: {cause(exc)}; {local_copy}") from exc
