"""One body reader with one set of limits for every route. The two defects a fuzzer found on the control routes
(which did not share the provider routes' reader), reproduced against each real server, and the limits that hold
everywhere now: a 400 or 413 in the control error shape, nothing left behind, the listings still answering."""

from __future__ import annotations

import json

import httpx

from polar_cli.web.body import MAX_JSON_DEPTH
from tests.proxy.test_hardening import provider_of, raw_request

from .conftest import Served


def control_error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    assert provider_of(resp.json()) == "control", resp.text[:300]
    message: str = resp.json()["error"]["message"]
    return message


def listings_answer(served: Served, client: httpx.Client) -> None:
    for path in served.listings:
        resp = client.get(path)
        assert resp.status_code == 200, (path, resp.text[:300])


def test_a_body_its_content_encoding_does_not_match_is_a_400(served: Served) -> None:
    """Was a 500 (``internal proxy error: RequestPayloadError``) on ``POST /sessions``."""
    plain = json.dumps(served.make_body("gzip-1", {})).encode()
    with served.client() as client:
        before = served.count(client)
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        resp = client.post(served.create, content=plain, headers=headers)
        assert "cannot read the request body" in control_error(resp, 400)
        assert resp.headers.get("connection", "").lower() == "close"  # nothing after a bad body can be parsed
        assert served.count(client) == before
        assert client.get(served.read_one("gzip-1")).status_code == 404
        listings_answer(served, client)


def test_a_body_nested_too_deep_is_a_400_and_leaves_nothing_behind(served: Served) -> None:
    """300 levels were created, answered 500, and then made every listing answer 500 until deleted; 129 got a 201."""
    with served.client() as client:
        before = served.count(client)
        for depth in (MAX_JSON_DEPTH + 1, 302, 1000):
            resp = client.post(served.create, content=served.body_of_depth(f"deep-{depth}", depth))
            assert f"nested deeper than {MAX_JSON_DEPTH}" in control_error(resp, 400)
            assert client.get(served.read_one(f"deep-{depth}")).status_code == 404
        assert served.count(client) == before
        listings_answer(served, client)


def test_a_body_at_the_depth_limit_is_accepted_and_reads_back(served: Served) -> None:
    with served.client() as client:
        resp = client.post(served.create, content=served.body_of_depth("at-limit", MAX_JSON_DEPTH))
        assert resp.status_code in (200, 201), resp.text[:300]
        thing = served.created_id(resp)
        assert client.get(served.read_one(thing)).status_code == 200
        listings_answer(served, client)
        if served.kind == "gateway":  # it runs, and its result (which embeds the task) is stored and read back
            result = client.get(f"/sessions/{thing}/result", params={"wait": 60})
            assert result.status_code == 200 and result.json()["status"] == "no_model_call", result.text[:500]  # `true`
            assert client.get(served.read_one(thing)).status_code == 200
        if served.kind == "proxy":
            assert client.delete(served.read_one(thing)).status_code == 200


def test_a_body_over_the_size_limit_is_a_413_before_it_is_read(served: Served) -> None:
    head = (
        f"POST {served.create} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {300 * 2**20}\r\n\r\n"
    ).encode()
    status, headers, body = raw_request(served.url, head + b"{" + b" " * 1000)
    assert status == 413, body[:300]
    assert headers["content-type"].startswith("application/json")
    parsed = json.loads(body)
    assert provider_of(parsed) == "control" and "MiB" in parsed["error"]["message"], parsed
