"""Stand-ins for the HuggingFace Hub's HTTP API, the one thing these tests mock: the Hub cannot be reached from CI.

It answers the calls ``huggingface_hub`` makes for ``create_repo`` and ``upload_folder`` (repo creation, the
card check, the pre-upload check, which it answers "regular" so file contents come inline, and the NDJSON commit)
and keeps the uploaded files in memory. ``huggingface_hub`` is pointed at it with ``HF_ENDPOINT``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiohttp import web


class FakeHub:
    def __init__(self, token: str = "hf_test_token") -> None:
        self.token = token
        self.repos: dict[str, dict[str, Any]] = {}
        self.files: dict[str, dict[str, bytes]] = {}
        self.unknown: list[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "Invalid credentials"}, status=401)
        body = await request.json()
        repo = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if repo in self.repos:
            return web.json_response({"error": "You already created this dataset repo", "url": ""}, status=409)
        self.repos[repo] = body
        self.files[repo] = {}
        return web.json_response({"url": f"{self.url}/datasets/{repo}", "name": repo})

    async def preupload(self, request: web.Request) -> web.Response:
        body = await request.json()
        files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in body["files"]]
        return web.json_response({"files": files, "commitOid": "0" * 40})

    async def commit(self, request: web.Request) -> web.Response:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        for line in (await request.read()).splitlines():
            item = json.loads(line)
            if item.get("key") == "file":
                value = item["value"]
                self.files[repo][value["path"]] = base64.b64decode(value["content"])
        oid = "1" * 40
        return web.json_response({"commitUrl": f"{self.url}/datasets/{repo}/commit/{oid}", "commitOid": oid,
                                  "pullRequestUrl": None})  # fmt: skip

    async def validate_yaml(self, request: web.Request) -> web.Response:
        return web.json_response({"errors": [], "warnings": []})

    async def alive(self, request: web.Request) -> web.Response:
        return web.Response()

    async def other(self, request: web.Request) -> web.Response:
        self.unknown.append(f"{request.method} {request.path}")
        return web.json_response({"error": "not in the fake hub"}, status=404)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/api/repos/create", self.create)
        app.router.add_post("/api/datasets/{org}/{name}/preupload/{rev}", self.preupload)
        app.router.add_post("/api/datasets/{org}/{name}/commit/{rev}", self.commit)
        app.router.add_post("/api/validate-yaml", self.validate_yaml)
        app.router.add_route("HEAD", "/", self.alive)  # polar push-hub's reachability check
        app.router.add_route("*", "/{tail:.*}", self.other)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> FakeHub:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()


class RefusingHub:
    """A stand-in for a Hub that answers every API call with one HTTP error (``status``, the Hub's JSON error body)
    and ``HEAD /`` with 200, so it is reachable. Real HTTP on a free port, in a thread."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.calls: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def answer(self) -> None:
                outer.calls.append(f"{self.command} {self.path}")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"error": f"refused with {outer.status}"}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = answer

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RefusingHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
