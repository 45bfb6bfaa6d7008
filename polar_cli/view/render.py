"""One self-contained HTML page of a ``ViewData``: the data as JSON in ``<script type="application/json">`` blocks,
the app (``app.js``, ``app.css``) inline, nothing fetched.

Session content is untrusted (harness output can hold ``</script>`` or HTML): the JSON has ``<``, ``>`` and ``&``
escaped as ``\\u003c`` ..., so no block can end early, and the app writes text only through escaping. A Content
Security Policy allows no network at all and no script but the app's own (by its hash), so even a slip could not run
injected code or fetch anything.

The index (one short row per session) comes before the app, each session's detail in its own block after it: the
list draws before the details are parsed, and a session's JSON is parsed only when it is opened.
"""

from __future__ import annotations

import base64
import hashlib
import html
from functools import cache
from importlib import resources
from typing import Any

import orjson

from polar_cli import __version__
from polar_cli.view.model import ViewData

_JSON_ESCAPES = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"))


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element (no ``<``, ``>`` or ``&`` left)."""
    data = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    for raw, escaped in _JSON_ESCAPES:
        data = data.replace(raw, escaped)
    return data.decode()


@cache
def _asset(name: str) -> str:
    return resources.files("polar_cli.view").joinpath(name).read_text(encoding="utf-8")


def _csp(app: str) -> str:
    digest = base64.b64encode(hashlib.sha256(app.encode()).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
            "base-uri 'none'; form-action 'none'")  # fmt: skip


def render_html(view: ViewData, *, title: str | None = None) -> str:
    """The page: a session list with filters and search, a session page per session (``#session=<id>``)."""
    app = _asset("app.js")
    title = title or f"polar view: {view.source}"
    header = {"source": view.source, "kind": view.kind, "version": __version__, "title": title}
    index = [s.index_row(n) for n, s in enumerate(view.sessions)]
    parts = [
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_csp(app)}\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{html.escape(title)}</title>\n<style>{_asset('app.css')}</style></head>\n<body>\n",
        f"<script type=\"application/json\" id=\"polar-header\">{script_json(header)}</script>\n",
        f"<script type=\"application/json\" id=\"polar-index\">{script_json(index)}</script>\n",
        f"<script>{app}</script>\n",
    ]  # fmt: skip
    for n, session in enumerate(view.sessions):
        parts.append(f"<script type=\"application/json\" id=\"polar-s{n}\">{script_json(session.detail())}</script>\n")
    parts.append("</body></html>\n")
    return "".join(parts)
