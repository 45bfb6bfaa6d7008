"""Fuzzing the control routes of every server Polar starts (the proxy's ``/sessions``, a gateway's routes and its
mounted proxy's, the rollout server's routes), real servers on loopback: whatever a client sends, the answer is never
a 5xx, every error is JSON in the control shape, and afterwards every listing route still answers 200.

In CI a small seeded, derandomized run; ``POLAR_FUZZ_EXAMPLES=10000`` runs that many examples per server with fresh
randomness (as tests/proxy/test_fuzz.py does for the provider routes):

    POLAR_FUZZ_EXAMPLES=10000 python -m pytest -q -p no:cacheprovider tests/web/test_fuzz_control.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import given
from hypothesis import strategies as st

from polar_cli.server.store import failed_result
from tests.proxy.test_fuzz import content_headers, fuzz_settings, mutated
from tests.proxy.test_hardening import provider_of

from .conftest import Served, shell_task

KNOWN = "fuzz-1"  # the id every valid body uses: the first one is created, the others conflict (a bounded workload)
NODE_TOKEN = "fuzz-node-token"

Body = Callable[[Served], dict[str, Any]]
Route = tuple[str, str, Body | None, str]
"""(method, path with ``{id}`` / ``{node}``, a valid body (None: no body), whose token it needs: server | node)."""


def _batch(served: Served) -> dict[str, Any]:
    return {"tasks": {KNOWN: shell_task(KNOWN)}, "sessions": [{"task_id": KNOWN, "session_id": KNOWN}]}


def _register(served: Served) -> dict[str, Any]:
    return {"url": "http://127.0.0.1:9", "token": NODE_TOKEN, "node_id": "fuzz-node", "capacity": {"run_slots": 1}}


def _result(served: Served) -> dict[str, Any]:
    result = failed_result(KNOWN, f"{KNOWN}-0-0", 0, "error", "fuzzed")
    return {"node_id": "fuzz-node", "session_id": result.session_id, "result": result.model_dump(mode="json")}


def _create(served: Served) -> dict[str, Any]:
    return served.make_body(KNOWN, {"k": "v"})


ROUTES: dict[str, list[Route]] = {
    "proxy": [
        ("POST", "/sessions", _create, "server"),
        ("GET", "/sessions", None, "server"),
        ("GET", "/sessions/{id}", None, "server"),
        ("GET", "/sessions/{id}/completions", None, "server"),
        ("DELETE", "/sessions/{id}", None, "server"),
        ("GET", "/healthz", None, "server"),
    ],
    "gateway": [
        ("POST", "/sessions", _create, "server"),
        ("POST", "/sessions/batch", _batch, "server"),
        ("GET", "/sessions/{id}", None, "server"),
        ("GET", "/sessions/{id}/result", None, "server"),
        ("DELETE", "/sessions/{id}", None, "server"),
        ("GET", "/metrics", None, "server"),
        ("GET", "/metrics.json", None, "server"),
        ("GET", "/healthz", None, "server"),
        ("POST", "/proxy/sessions", lambda served: {"session_id": KNOWN, "metadata": {"k": "v"}}, "server"),
        ("GET", "/proxy/sessions", None, "server"),
        ("GET", "/proxy/sessions/{id}", None, "server"),
    ],
    "server": [
        ("POST", "/rollout/task/submit", _create, "server"),
        ("GET", "/rollout/task/{id}", None, "server"),
        ("DELETE", "/rollout/task/{id}", None, "server"),
        ("GET", "/rollout/status", None, "server"),
        ("GET", "/metrics", None, "server"),
        ("POST", "/nodes/register", _register, "server"),
        ("POST", "/nodes/{node}/heartbeat", lambda served: {"sessions": [], "draining": False}, "node"),
        ("POST", "/callbacks/session_result", _result, "node"),
        ("GET", "/healthz", None, "server"),
    ],
}
IDS = [KNOWN, "nope", "a" * 129, "..", ".hidden", "-x", "x y", "é", "%00", "a/b", ""]
OPEN = {"/", "/healthz", "/proxy", "/proxy/", "/proxy/healthz"}
"""Routes that answer without a token."""
WAITS = [None, "0", "0.01", "-1", "nan", "abc", "", "1e-9"]


@st.composite
def control_requests(draw: st.DrawFn, served: Served) -> tuple[str, str, dict[str, str], bytes, str]:
    method, template, valid, token = draw(st.sampled_from(ROUTES[served.kind]))
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    thing = draw(st.one_of(st.sampled_from(IDS), st.text(max_size=12)))
    node = draw(st.sampled_from(["fuzz-node", "fuzz-node", "other-node", "..", ""]))
    path = template.replace("{id}", quote(thing, safe="")).replace("{node}", quote(node, safe=""))
    wait = draw(st.sampled_from(WAITS))
    if wait is not None and "{id}" in template:
        path += f"?wait={wait}"
    base = valid(served) if valid is not None else {}
    kind = draw(st.integers(0, 9))
    if kind <= 5:
        raw = json.dumps(draw(mutated(base))).encode()  # json: it writes ints past 64 bits
    elif kind == 6:
        depth = draw(st.sampled_from([100, 127, 128, 129, 200, 254, 255, 256, 300, 1023, 1025, 5000]))
        raw = served.body_of_depth(KNOWN, depth) if template == served.create else b"[" * depth + b"]" * depth
    elif kind == 7:
        raw = draw(st.binary(max_size=64))
    elif kind == 8:
        raw = json.dumps(base).encode()[: draw(st.integers(0, 40))]
    else:
        raw = b""
    headers, raw = content_headers(draw, raw)
    auth = draw(st.sampled_from(["token", "token", "token", "token", "none", "wrong", "odd"]))
    if auth != "none":
        secret = {"server": served.token, "node": NODE_TOKEN}[token]
        presented = {"token": secret, "wrong": "wrong", "odd": "\udcff\udcfe" + secret}[auth]
        headers["Authorization"] = f"Bearer {presented}"
    return method, path, headers, raw, auth


def _header_value(value: str) -> str | bytes:
    return value.encode("utf-8", "surrogateescape") if "\udcff" in value else value


def test_fuzz_control_routes(served: Served) -> None:
    with served.client() as client, httpx.Client(base_url=served.url, timeout=30) as stranger:
        if served.kind == "server":  # the node the node-token routes are called as
            assert client.post("/nodes/register", json=_register(served)).status_code == 200

        @fuzz_settings(ci_examples=300)
        @given(control_requests(served))
        def check(request: tuple[str, str, dict[str, str], bytes, str]) -> None:
            method, path, headers, raw, auth = request
            sent: dict[str, str | bytes] = {name: _header_value(value) for name, value in headers.items()}
            resp = stranger.request(method, path, content=raw, headers=sent)  # no token unless the example gives one
            assert resp.status_code < 500, (method, path, headers, raw[:200], resp.text[:300])
            if resp.status_code >= 400:
                assert resp.headers["content-type"].startswith("application/json"), resp.headers
                assert provider_of(resp.json()) == "control", resp.text[:300]
            seen = resp.request.url.path  # the client folds "/sessions/.." to "/"
            if auth != "token" and seen not in OPEN:  # refused: by the guard, the router or the HTTP parser
                assert resp.status_code >= 400, (method, path, resp.text[:300])

        check()
        for path in served.listings:  # nothing the fuzz left behind breaks a listing
            resp = client.get(path)
            assert resp.status_code == 200, (path, resp.text[:300])
        resp = client.post(served.create, json=served.make_body("after-fuzz", {}))
        assert resp.status_code in (200, 201), resp.text[:300]
