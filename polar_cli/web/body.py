"""The one request-body reader of every route Polar serves (the proxy's provider and control routes, a gateway's
routes, the rollout server's routes), with one set of limits:

- size: at most the route's own limit (``limit``: the rollout server's and a gateway's routes each have one,
  ``polar_cli.models.limits``) and the app's ``client_max_size`` (the proxy and a gateway: ``max_body_mb``; the
  rollout server: ``MAX_RESULT_BODY_BYTES``), else a 413: refused before a byte is read when ``Content-Length`` says
  so, else once the limit is read (of the decoded body, so a compressed body cannot inflate past it);
- framing and encoding: a body its ``Content-Encoding`` does not match (``gzip`` on plain JSON) or bad chunked
  framing is a 400 (the connection closes after the answer: nothing after such a body can be parsed);
- memory: a body of a control route (:func:`read_json`: the rollout server's, a gateway's, the proxy's control routes)
  of 1 MiB or more holds at most one array or object per :data:`BYTES_PER_CONTAINER` bytes, else a 400 before it is
  parsed, so what it costs once parsed stays a small multiple of its size;
- JSON: valid, and nested at most :data:`MAX_JSON_DEPTH` arrays/objects deep, else a 400. orjson writes at most 255
  levels, and what a route accepts is written back a few levels down (the journal embeds a provider body, a session
  summary its metadata, a result its task): anything accepted can be written back, so nothing accepted can make a
  later read of it fail.

Bodies of :data:`OFFLOAD_BYTES` or more are parsed and checked in a worker thread, so the event loop keeps serving.
Every refusal is a ProtocolError (400) or BodyTooLargeError (413): each route answers it in its own error shape. A
``Content-Encoding`` nobody here can decode never reaches this reader (:mod:`polar_cli.web.intake`: a 415).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from polar_cli.errors import BodyTooLargeError, ProtocolError

MAX_JSON_DEPTH = 128
"""Deepest nesting of arrays/objects a request body may have (the body itself is level 1)."""
OFFLOAD_BYTES = 256 * 1024
"""Bodies at least this large are parsed and checked in a worker thread."""
BYTES_PER_CONTAINER = 16
"""A body read by :func:`read_json` of :data:`DENSE_CHECK_BYTES` or more holds at most one array or object per this
many bytes (counted as ``[`` and ``{`` bytes, those inside strings too): an empty array costs Python 64 bytes for its
3, so a body of nothing but ``[],`` would take 20-50 times its size once parsed and validated."""
DENSE_CHECK_BYTES = 1 << 20
"""Bodies below this size are never refused for their density of arrays/objects."""


def too_deep(value: Any) -> bool:
    """True when ``value`` nests arrays/objects deeper than MAX_JSON_DEPTH (a walk over containers only: a few
    microseconds for a chat body; the value itself counts as level 1)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        inner = [child for child in children if isinstance(child, dict | list)]
        if inner:
            if depth >= MAX_JSON_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in inner)
    return False


def _prefix(source: str | None) -> str:
    return f"{source}: " if source else ""


def parse_json(raw: bytes, *, source: str | None = None) -> Any:
    """``raw`` as JSON, only if it can be written back (nesting within MAX_JSON_DEPTH); else a ProtocolError naming
    ``source`` (e.g. ``"POST /sessions"``) when given."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"{_prefix(source)}request body is not valid JSON: {str(exc)[:200]}") from exc
    if isinstance(value, dict | list) and too_deep(value):
        raise ProtocolError(f"{_prefix(source)}request body is nested deeper than {MAX_JSON_DEPTH} levels")
    return value


async def read_raw(request: web.Request, *, source: str | None = None, limit: int | None = None) -> bytes:
    """The request's body bytes, decoded as its ``Content-Encoding`` says, within ``limit`` bytes (a route's own
    bound) and the app's ``client_max_size``, whichever is smaller. A body the client cuts short is a 400 (the
    client has gone; the answer is only logged)."""
    bound = request.client_max_size if limit is None else min(limit, request.client_max_size)
    too_large = f"{_prefix(source)}request body is larger than this route's limit of {bound / (1 << 20):g} MiB"
    if request.content_length is not None and request.content_length > bound:
        raise BodyTooLargeError(too_large)  # refused before reading a byte of it
    try:
        if bound >= request.client_max_size:
            return await request.read()  # aiohttp's own reader: it keeps the bytes for a later read()
        return await _read_within(request, bound, too_large)
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLargeError(too_large) from exc
    except (RequestPayloadError, HttpProcessingError) as exc:  # bad chunking, a body its Content-Encoding is not
        raise ProtocolError(f"{_prefix(source)}cannot read the request body: {str(exc)[:200]}") from exc
    except ConnectionResetError as exc:  # aiohttp's "Connection lost": the client hung up mid-body
        raise ProtocolError(f"{_prefix(source)}the client closed the connection before the body ended") from exc


async def _read_within(request: web.Request, bound: int, too_large: str) -> bytes:
    """The body, decoded, refused (413) as soon as more than ``bound`` bytes of it are read."""
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > bound:
            raise BodyTooLargeError(too_large)
    return bytes(body)


def too_dense(raw: bytes) -> bool:
    """True when ``raw`` (of DENSE_CHECK_BYTES or more) may hold more than one array or object per
    BYTES_PER_CONTAINER bytes: a scan at memory speed, before anything is parsed."""
    return len(raw) >= DENSE_CHECK_BYTES and (raw.count(b"[") + raw.count(b"{")) * BYTES_PER_CONTAINER > len(raw)


def _parse_bounded(raw: bytes, *, source: str | None = None) -> Any:
    if too_dense(raw):
        raise ProtocolError(
            f"{_prefix(source)}request body holds more than one array or object per {BYTES_PER_CONTAINER} bytes "
            f"({len(raw) / (1 << 20):.1f} MiB): refused before parsing, as it would take many times its size in memory"
        )
    return parse_json(raw, source=source)


async def _parse(raw: bytes, source: str | None, *, bounded: bool = False) -> Any:
    parse = _parse_bounded if bounded else parse_json
    if len(raw) >= OFFLOAD_BYTES:
        return await asyncio.to_thread(parse, raw, source=source)
    return parse(raw, source=source)


async def read_json(
    request: web.Request, *, source: str | None = None, default: Any = None, limit: int | None = None
) -> Any:
    """The request body as JSON (any JSON value: the route's model checks its type), at most ``limit`` bytes (see
    :func:`read_raw`). An empty body is ``default`` when one is given, else a 400 naming ``source``."""
    raw = await read_raw(request, source=source, limit=limit)
    if not raw.strip():
        if default is not None:
            return default
        raise ProtocolError(f"{_prefix(source)}the request body is empty (expected JSON)")
    return await _parse(raw, source, bounded=True)


async def read_object(request: web.Request) -> tuple[dict[str, Any], bytes]:
    """The request body as a JSON object, and its bytes (a provider route journals them as sent)."""
    raw = await read_raw(request)
    body = await _parse(raw, None) if raw else None
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    return body, raw
