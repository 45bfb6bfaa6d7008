"""The proxy app: control routes, session routing and key checks, side endpoints, journal, errors."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from polar_cli.proxy.journal import read_journal

from .conftest import ProxySession, RunningProxy, closing

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(session: ProxySession, key: str | None = None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{session.openai_base}/chat/completions", json=CHAT, headers=headers)


def test_session_lifecycle(proxy: RunningProxy) -> None:
    resp = proxy.http.post("/sessions", json={"session_id": "life-1", "metadata": {"task": "t1"}})
    assert resp.status_code == 201
    info = resp.json()
    assert info["session_id"] == "life-1" and info["api_key"] and info["metadata"] == {"task": "t1"}
    root = f"{proxy.url}/s/life-1"
    assert info["base_urls"] == {"anthropic": root, "openai": root + "/v1", "google": root}
    assert proxy.http.post("/sessions", json={"session_id": "life-1"}).status_code == 409
    assert proxy.http.post("/sessions", json={"session_id": "../etc"}).status_code == 400
    assert proxy.http.post("/sessions", json={"sesion_id": "x"}).json()["error"]["message"].find("session_id") > 0

    got = proxy.http.get("/sessions/life-1").json()
    assert got["completions"] == 0 and "api_key" not in got
    assert "life-1" in [s["session_id"] for s in proxy.http.get("/sessions").json()["sessions"]]

    session = ProxySession(proxy, "life-1", info["api_key"], info["base_urls"])
    assert chat(session, info["api_key"]).status_code == 200
    assert proxy.http.get("/sessions/life-1").json()["completions"] == 1

    deleted = proxy.http.delete("/sessions/life-1").json()
    assert deleted["deleted"] and deleted["completions"] == 1
    assert Path(deleted["journal"]).exists()  # the journal stays on disk
    assert proxy.http.get("/sessions/life-1").status_code == 404
    assert chat(session, info["api_key"]).status_code == 401  # no longer routed
    assert proxy.http.delete("/sessions/life-1").status_code == 404


def test_auth_isolation_between_sessions(proxy: RunningProxy) -> None:
    a, b = proxy.new_session(script=[{"content": "A"}]), proxy.new_session(script=[{"content": "B"}])
    api = closing(openai.OpenAI(base_url=b.openai_base, api_key=a.api_key, max_retries=0))
    with api, pytest.raises(openai.AuthenticationError) as info:
        api.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    assert chat(b).status_code == 401  # no key at all
    assert chat(b, "wrong").status_code == 401
    assert a.completions() == [] and b.completions() == []
    assert httpx.post(f"{proxy.url}/s/nope/v1/chat/completions", json=CHAT).status_code == 401


@pytest.mark.parametrize("where", ["x-api-key", "bearer", "x-goog-api-key", "query"])
def test_every_key_location_is_accepted(proxy: RunningProxy, where: str) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    url, headers = f"{session.openai_base}/chat/completions", {}
    if where == "bearer":
        headers["Authorization"] = f"Bearer {session.api_key}"
    elif where == "query":
        url += f"?key={session.api_key}"
    else:
        headers[where] = session.api_key
    resp = httpx.post(url, json=CHAT, headers=headers)
    assert resp.status_code == 200, resp.text
    assert len(session.completions()) == 1


def test_side_endpoints_are_answered_and_never_recorded(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    auth = {"Authorization": f"Bearer {session.api_key}"}
    models = httpx.get(f"{session.openai_base}/models", headers=auth).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "polar-scripted"
    anthropic = httpx.get(f"{session.anthropic_base}/v1/models", headers={"x-api-key": session.api_key}).json()
    assert anthropic["data"][0]["type"] == "model"
    google = httpx.get(f"{session.google_base}/v1beta/models", headers={"x-goog-api-key": session.api_key}).json()
    assert google["models"][0]["name"] == "models/polar-scripted"
    assert httpx.head(session.anthropic_base).status_code == 200
    assert httpx.get(session.openai_base).status_code == 200
    assert httpx.head(proxy.url + "/").status_code == 200
    missing = httpx.post(f"{session.openai_base}/embeddings", json={}, headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert session.completions() == []
    assert httpx.get(f"{session.openai_base}/models").status_code == 401  # side endpoints still need the key


def test_malformed_json_gets_a_provider_shaped_400(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])
    headers = {"Authorization": f"Bearer {session.api_key}", "Content-Type": "application/json"}
    for raw in (b"{not json", b"[1, 2]", b""):
        resp = httpx.post(f"{session.openai_base}/chat/completions", content=raw, headers=headers)
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and ("JSON" in error["message"])
    assert session.completions() == []


def test_journal_is_written_before_the_answer(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"content": "one"}, {"content": "two"}], metadata={"k": "v"})
    path = Path(proxy.http.get(f"/sessions/{session.session_id}").json()["journal"])
    assert chat(session, session.api_key).status_code == 200
    lines = path.read_bytes().splitlines()  # read as soon as the answer arrived
    assert len(lines) == 1 and json.loads(lines[0])["response_message"]["content"] == "one"
    assert chat(session, session.api_key).status_code == 200
    records = read_journal(path)
    assert [r.index for r in records] == [0, 1] and records[1].response_message["content"] == "two"
    assert [r["completion_id"] for r in session.completions()] == [r.completion_id for r in records]
    assert proxy.state.get_completions(session.session_id) == records  # the Python API agrees


def test_in_memory_sessions_and_python_api(start_proxy: Callable[..., RunningProxy]) -> None:
    running = start_proxy(journal_dir=None)
    info = running.run(running.state.create_session("mem-1", backend_options={"script": [{"content": "hey"}]}))
    assert info["journal"] is None and info["base_urls"]["openai"].endswith("/s/mem-1/v1")
    session = ProxySession(running, "mem-1", info["api_key"], info["base_urls"])
    assert chat(session, session.api_key).json()["choices"][0]["message"]["content"] == "hey"
    [record] = running.state.get_completions("mem-1")
    assert record.session_id == "mem-1" and record.prompt_ids and record.response_ids
    assert session.completions()[0]["completion_id"] == record.completion_id
    closed = running.run(running.state.close_session("mem-1"))
    assert closed.count == 1 and "mem-1" not in running.state.registry


def test_script_from_metadata_and_proxy_wide_default(start_proxy: Callable[..., RunningProxy], tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("- content: from the file\n")
    running = start_proxy(script=str(script))
    default, own = running.new_session(), running.new_session(metadata={"script": [{"content": "from metadata"}]})
    assert chat(default, default.api_key).json()["choices"][0]["message"]["content"] == "from the file"
    assert chat(own, own.api_key).json()["choices"][0]["message"]["content"] == "from metadata"
    assert "script" not in running.http.get(f"/sessions/{own.session_id}").json()["metadata"]
    bad = running.http.post("/sessions", json={"script": [{"content": "x", "tool_calls": [{"function": {}}]}]})
    assert bad.status_code == 400 and "tool_calls" in bad.json()["error"]["message"]


def test_exhausted_script_final_text_or_error(start_proxy: Callable[..., RunningProxy]) -> None:
    session = start_proxy().new_session(script=[{"content": "only"}])
    chat(session, session.api_key)
    final = chat(session, session.api_key).json()["choices"][0]
    assert "no more turns" in final["message"]["content"] and final["finish_reason"] == "stop"

    strict = start_proxy(backend_options={"on_exhausted": "error"}).new_session(script=[])
    resp = chat(strict, strict.api_key)
    assert resp.status_code == 502 and "has no turn 1" in resp.json()["error"]["message"]
    assert strict.completions() == []


def test_scripted_error_turn_is_a_provider_error(proxy: RunningProxy) -> None:
    session = proxy.new_session(script=[{"error": {"status": 429, "message": "slow down"}}, {"content": "ok"}])
    first = chat(session, session.api_key)
    assert first.status_code == 429 and first.json()["error"]["type"] == "rate_limit_error"
    assert chat(session, session.api_key).status_code == 200
    assert len(session.completions()) == 1


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("stream", [False, True])
def test_backend_down_gives_provider_error_after_retries(
    start_proxy: Callable[..., RunningProxy], stream: bool
) -> None:
    running = start_proxy(
        backend="vllm",
        backend_url=f"http://127.0.0.1:{_unused_port()}",
        model="served",
        retry={"attempts": 3, "base_delay_s": 0.001, "max_delay_s": 0.002},
    )
    session = running.new_session()
    api = closing(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))
    with api, pytest.raises(openai.APIStatusError) as info:
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
    assert info.value.status_code == 502
    assert "unreachable" in info.value.message and "after 3 attempts" in info.value.message
    assert session.completions() == []


def test_internal_errors_never_leak_a_traceback(proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    session = proxy.new_session(script=[{"content": "ok"}])

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kaboom")

    monkeypatch.setattr("polar_cli.proxy.app.completion_record", boom)
    resp = chat(session, session.api_key)
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "internal proxy error: RuntimeError: kaboom"
    assert "Traceback" not in resp.text
