"""A hostile local user against the proxy: control routes need the token, session scripts are never host paths,
session ids follow one rule, and nothing under ``/s/<id>`` tells which sessions exist."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.errors import ConfigError
from polar_cli.proxy.config import ProxyConfig

from .conftest import RunningProxy

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_config_without_a_token_gets_a_generated_one() -> None:
    tokens = {ProxyConfig().control_token, ProxyConfig(control_token=None).control_token, ProxyConfig().control_token}
    assert len(tokens) == 3 and all(len(t) >= 32 for t in tokens)
    assert ProxyConfig(control_token="mine").control_token == "mine"


def test_control_routes_refuse_another_local_user(proxy: RunningProxy) -> None:
    session = proxy.new_session(session_id="guarded-1", script=[{"content": "secret answer"}])
    answer = httpx.post(
        f"{session.openai_base}/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {session.api_key}"}
    )
    assert answer.status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": proxy.config.control_token}):
        with httpx.Client(base_url=proxy.url, headers=headers) as stranger:
            calls = [
                stranger.get("/sessions"),
                stranger.post("/sessions", json={"session_id": "planted"}),
                stranger.get("/sessions/guarded-1"),
                stranger.get("/sessions/guarded-1/completions"),
                stranger.delete("/sessions/guarded-1"),
            ]
        for resp in calls:
            assert resp.status_code == 401, resp.text
            assert resp.json()["error"]["type"] == "unauthorized"
            assert "secret answer" not in resp.text and session.api_key not in resp.text
    assert "planted" not in proxy.state.registry and "guarded-1" in proxy.state.registry
    assert [c["response_message"]["content"] for c in session.completions()] == ["secret answer"]
    health = httpx.get(f"{proxy.url}/healthz")
    assert health.status_code == 200 and health.json() == {"ok": True}


@pytest.fixture
def host_paths(tmp_path: Path) -> dict[str, str]:
    script = tmp_path / "script.yaml"
    script.write_text("- content: read from the host\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"file": str(script), "fifo": str(fifo), "passwd": "/etc/passwd"}


@pytest.mark.parametrize("field", ["script", "backend_options.script", "metadata.script"])
def test_session_scripts_are_never_host_paths(proxy: RunningProxy, host_paths: dict[str, str], field: str) -> None:
    for what, path in host_paths.items():
        body: dict[str, Any] = {"session_id": f"path-{what}-{field.replace('.', '-')}"}
        if "." in field:
            outer, inner = field.split(".")
            body[outer] = {inner: path}
        else:
            body[field] = path
        resp = proxy.http.post("/sessions", json=body, timeout=20)  # a FIFO opened for reading would block here
        assert resp.status_code == 400, (what, resp.text)
        message = resp.json()["error"]["message"]
        assert field.split(".")[0] in message and "inline list" in message, message
        assert "read from the host" not in message and "root:" not in message
        assert body["session_id"] not in proxy.state.registry
    assert proxy.http.get("/sessions").status_code == 200  # still serving


def test_the_python_api_takes_inline_scripts_only(proxy: RunningProxy, host_paths: dict[str, str]) -> None:
    for path in (host_paths["fifo"], Path(host_paths["file"])):
        for kwargs in ({"backend_options": {"script": path}}, {"metadata": {"script": path}}):
            with pytest.raises(ConfigError, match="inline list"):
                proxy.run(proxy.state.create_session(None, **kwargs))
        with pytest.raises(ConfigError, match="inline list"):
            proxy.run(proxy.state.backend.open_session("direct", {"script": path}))


def test_backend_options_are_an_allow_list(proxy: RunningProxy, start_proxy: Callable[..., RunningProxy]) -> None:
    for options in ({"tokenizer": "/etc"}, {"on_exhausted": "error"}, {"script": [], "model": "x"}):
        resp = proxy.http.post("/sessions", json={"backend_options": options})
        assert resp.status_code == 400 and "backend_options" in resp.json()["error"]["message"], resp.text
    twice = proxy.http.post("/sessions", json={"script": [], "backend_options": {"script": []}})
    assert twice.status_code == 400
    ok = proxy.http.post("/sessions", json={"backend_options": {"script": [{"content": "fine"}]}})
    assert ok.status_code == 201, ok.text


BAD_IDS = ["abc%0A", "abc%0D%0A", "abc%00", "%2E%2E"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_malformed_session_id_is_400_on_every_route(proxy: RunningProxy, bad: str) -> None:
    session = proxy.new_session(session_id="abc", script=[])
    auth = {"Authorization": f"Bearer {session.api_key}"}
    answers = [
        proxy.http.get(f"/sessions/{bad}"),
        proxy.http.get(f"/sessions/{bad}/completions"),
        proxy.http.delete(f"/sessions/{bad}"),
        httpx.get(f"{proxy.url}/s/{bad}"),
        httpx.head(f"{proxy.url}/s/{bad}/v1"),
        httpx.post(f"{proxy.url}/s/{bad}/v1/chat/completions", json=CHAT, headers=auth),
        httpx.get(f"{proxy.url}/s/{bad}/v1/models", headers=auth),
    ]
    assert [a.status_code for a in answers] == [400] * len(answers), [(a.request.url, a.text) for a in answers]
    created = proxy.http.post("/sessions", json={"session_id": "abc\n"})
    assert created.status_code == 400 and "session_id" in created.json()["error"]["message"]
    assert session.completions() == [] and "abc" in proxy.state.registry
    proxy.http.delete("/sessions/abc")


def _base_probes(url: str, headers: dict[str, str]) -> list[tuple[int, bytes]]:
    answers = [httpx.request(method, url + tail, headers=headers) for method in ("GET", "HEAD") for tail in ("", "/v1")]
    return [(a.status_code, a.content) for a in answers]


def _probe(url: str, headers: dict[str, str]) -> list[tuple[int, bytes]]:
    anthropic = {**headers, "anthropic-version": "2023-06-01"}
    answers = [
        httpx.get(url + "/v1/models", headers=headers),
        httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers),
        httpx.post(url + "/v1/responses", json={"model": "m", "input": "hi"}, headers=headers),
        httpx.post(url + "/v1/messages", json={**CHAT, "max_tokens": 5}, headers=anthropic),
        httpx.post(url + "/v1/messages/count_tokens", json=CHAT, headers=anthropic),
        httpx.post(url + "/v1beta/models/m:generateContent", json={"contents": []}, headers=headers),
        httpx.post(url + "/v1/embeddings", json={}, headers=headers),
        httpx.delete(url + "/v1/chat/completions", headers=headers),
    ]
    return _base_probes(url, headers) + [(a.status_code, a.content) for a in answers]


def test_unknown_and_existing_sessions_answer_alike_without_a_key(proxy: RunningProxy) -> None:
    session = proxy.new_session(session_id="exists-1", script=[{"content": "never"}])
    base = f"{proxy.url}/s/"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        existing, unknown = _probe(base + "exists-1", headers), _probe(base + "absent-1", headers)
        assert existing == unknown
        assert {status for status, _ in existing} == {200, 401}
    # the base route answers every well-formed id alike, keyed or not (harnesses probe it, often without a key)
    keyed = _base_probes(base + "exists-1", {"Authorization": f"Bearer {session.api_key}"})
    assert keyed == _base_probes(base + "absent-1", {}) and [s for s, _ in keyed] == [200] * 4
    assert session.completions() == []


def test_the_registry_checks_ids_in_full(proxy: RunningProxy) -> None:
    with pytest.raises(ConfigError, match="invalid session_id"):
        proxy.run(proxy.state.registry.create_session("abc\n"))


def test_a_backend_without_session_options_takes_none(start_proxy: Callable[..., RunningProxy]) -> None:
    running = start_proxy(backend="vllm", backend_url="http://127.0.0.1:9", model="served")
    for body in ({"backend_options": {"script": []}}, {"script": [{"content": "x"}]}, {"metadata": {"script": "/x"}}):
        resp = running.http.post("/sessions", json=body)
        assert resp.status_code == 400, resp.text
    # a task's inline script is for the scripted backend: another backend leaves it out (and out of the metadata)
    info = running.http.post("/sessions", json={"metadata": {"script": [{"content": "x"}], "group": "g"}}).json()
    assert info["metadata"] == {"group": "g"}
