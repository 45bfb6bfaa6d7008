"""``polar view --serve``: the page on a localhost port, read-only (GET and HEAD of ``/``), until stopped.

No token guards it: it serves one static page, binds 127.0.0.1 only, accepts no input and changes nothing; anyone who
can reach a localhost port can already read the results file it was made from (docs/view.md says so).
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ViewServer(ThreadingHTTPServer):
    """Serves ``page`` at ``/`` (and ``/index.html``) on ``host:port`` (port 0: a free one); 404 elsewhere."""

    daemon_threads = True

    def __init__(self, page: bytes, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.page = page
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (tests; ``serve_forever`` blocks the caller)."""
        thread = threading.Thread(target=self.serve_forever, name="polar-view", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer

    def _send(self, body: bool) -> None:
        if self.path.split("?", 1)[0] not in ("/", "/index.html"):
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        page = self.server.page
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if body:
            self.wfile.write(page)

    def do_GET(self) -> None:
        self._send(True)

    def do_HEAD(self) -> None:
        self._send(False)

    def log_message(self, format: str, *args: object) -> None:  # library code never prints
        pass
