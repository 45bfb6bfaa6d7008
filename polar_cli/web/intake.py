"""``intake``: the outermost middleware of every server Polar starts (the proxy, a gateway node, the rollout server),
what happens to a request before any handler can read its body, and to its connection after the answer.

- Authentication comes first: every route checks its token (``polar_cli.web.auth.guarded``, a node's token, a
  session's key) before its handler reads a byte of the body, so a caller without the token costs nothing: invalid
  JSON, or a 100 MiB body, without a token is a 401 and the body is never read.
- A ``Content-Encoding`` this server cannot decode (anything but ``identity``, ``gzip``, ``deflate``, and ``br`` /
  ``zstd`` where aiohttp has their decoders) is a 415 in the route's own error shape: aiohttp would read such a body
  as identity.
- A refused request that left more than :data:`DRAIN_BYTES` of its body unread (a 401, a 415, a 413 from
  ``Content-Length``), or whose body could not be decoded, closes its connection after the answer: aiohttp would
  otherwise read and drop the rest of the body for up to 10 s, and nothing after a bad body on that connection can be
  parsed anyway.

Failures are answered and logged by :func:`polar_cli.web.errors.json_errors` (inside this one): a client's error
(4xx: a cut or refused body, bad JSON, a failed validation) is one INFO line, never a traceback.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD

from polar_cli.web.errors import Handler, log_refusal, shaped_error

_DECODERS = {"br": HAS_BROTLI, "zstd": HAS_ZSTD}
ENCODINGS = frozenset({"identity", "gzip", "deflate"} | {name for name, installed in _DECODERS.items() if installed})
"""The ``Content-Encoding`` values a request body may have here (one coding: aiohttp decodes no stacked codings)."""


DRAIN_BYTES = 64 * 1024
"""The most of a refused request's unread body that is still read (and dropped) to keep its connection open."""


def unsupported_encoding(request: web.Request) -> str | None:
    """Why the request's ``Content-Encoding`` cannot be read here, or None when it can (or there is no body)."""
    encoding = request.headers.get("Content-Encoding")
    if encoding is None or not request.body_exists or encoding.strip().lower() in ENCODINGS:
        return None
    shown = encoding[:100].encode("ascii", "backslashreplace").decode()
    return f"Content-Encoding {shown!r} is not supported: send the body as one of {', '.join(sorted(ENCODINGS))}"


@web.middleware
async def intake(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a body this server cannot decode before any handler runs; close the connection after a refused request
    whose body was not read to its end."""
    refused = unsupported_encoding(request)
    if refused is not None:
        log_refusal("server", request.method, request.path, 415, refused)
        response: web.StreamResponse = shaped_error(request, 415, refused)
    else:
        response = await handler(request)
    if not response.prepared and _body_left(request, response):
        response.force_close()
    return response


def _body_left(request: web.Request, response: web.StreamResponse) -> bool:
    """Whether what is left of the request's body must not be read on this connection: it failed to decode; it is
    encoded (decoding it after the answer may fail); or a refusal left more than :data:`DRAIN_BYTES` of it unread
    (or an unknown amount: chunked). A small rest is read and dropped by aiohttp, keeping the connection."""
    body = request.content
    if body.exception() is not None:
        return True
    if body.at_eof():
        return False
    if request.headers.get("Content-Encoding"):
        return True
    if response.status < 400:
        return False
    length = request.content_length
    return length is None or length - body.total_bytes > DRAIN_BYTES
