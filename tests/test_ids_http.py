"""The shared session-id rule and the control surfaces' HTTP helpers."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from polar_cli.errors import AuthError, BackendError, ConfigError, SessionError, SessionExistsError
from polar_cli.ids import check_session_id, is_session_id
from polar_cli.web.auth import guarded, resolve_token
from polar_cli.web.errors import json_errors, json_response, status_for


@pytest.mark.parametrize("good", ["a", "abc-1.2_3", "A" * 128, "0x"])
def test_valid_session_ids(good: str) -> None:
    assert is_session_id(good)
    assert check_session_id(good) == good


@pytest.mark.parametrize("bad", ["", "abc\n", "a/b", "../x", ".hidden", "-x", "a" * 129, "a b", "é", None, 3])
def test_invalid_session_ids(bad: object) -> None:
    assert not is_session_id(bad)
    with pytest.raises(ConfigError):
        check_session_id(bad)


def test_statuses_are_declared_on_the_error_classes() -> None:
    assert status_for(ConfigError("x")) == 400
    assert status_for(AuthError("x")) == 401
    assert status_for(SessionError("x")) == 404
    assert status_for(SessionExistsError("x")) == 409
    assert status_for(BackendError("x", status=429)) == 429
    assert status_for(ValueError("x")) == 500


def test_resolve_token(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_token("given", "POLAR_TEST_TOKEN") == ("given", False)
    monkeypatch.setenv("POLAR_TEST_TOKEN", "from-env")
    assert resolve_token(None, "POLAR_TEST_TOKEN") == ("from-env", False)
    monkeypatch.delenv("POLAR_TEST_TOKEN")
    token, generated = resolve_token(None, "POLAR_TEST_TOKEN")
    assert generated and len(token) >= 40


def test_guard_and_error_shape() -> None:
    asyncio.run(_guard_and_error_shape())


async def _guard_and_error_shape() -> None:
    async def ok(request: web.Request) -> web.Response:
        return json_response({"ok": True})

    async def boom(request: web.Request) -> web.Response:
        raise SessionExistsError("taken")

    app = web.Application(middlewares=[json_errors(what="test")], client_max_size=1024)
    app.router.add_post("/ok", guarded("secret", "test", ok))
    app.router.add_get("/boom", boom)
    async with TestClient(TestServer(app)) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer secret\udcff"}):
            resp = await client.post("/ok", headers={k: v.encode("utf-8", "surrogateescape").decode("latin-1")
                                                     for k, v in headers.items()})  # fmt: skip
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "unauthorized"
        resp = await client.post("/ok", headers={"Authorization": "Bearer secret"})
        assert resp.status == 200
        resp = await client.get("/boom")
        assert resp.status == 409 and (await resp.json())["error"]["message"] == "taken"
        for method, path, status in (("GET", "/nowhere", 404), ("GET", "/ok", 405)):
            resp = await client.request(method, path)
            assert resp.status == status
            assert resp.content_type == "application/json"
        resp = await client.post("/ok", data=b"x" * 4096, headers={"Authorization": "Bearer secret"})
        assert resp.status == 200  # the handler never read the body
