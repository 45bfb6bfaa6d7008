"""Upstream failures: transient ones are retried within the call's deadline, a hung upstream is bounded by the
session's deadline, and the CLI flags set the per-attempt timeout and the retry count."""

from __future__ import annotations

import email.utils
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from polar_cli.proxy.retry import parse_retry_after

from .conftest import LoopThread, ProxySession, RunningProxy
from .upstream import Action, Upstream

FAST_RETRY = {"attempts": 3, "base_delay_s": 0.001, "max_delay_s": 0.002}


def chat(session: ProxySession, text: str = "hi", **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{session.openai_base}/chat/completions",
        headers={"Authorization": f"Bearer {session.api_key}"},
        json={"model": "m", "messages": [{"role": "user", "content": text}], **extra},
        timeout=60,
    )


@pytest.fixture
def upstream(loop_thread: LoopThread) -> Upstream:
    return Upstream(loop_thread)


def _http_date(offset_s: float) -> str:
    return email.utils.formatdate(time.time() + offset_s, usegmt=True)


@pytest.mark.parametrize(
    "failure",
    [
        ("json", 500, {"error": {"message": "internal"}}, None),
        ("json", 502, {"error": {"message": "bad gateway"}}, None),
        ("json", 503, {"error": {"message": "busy"}}, None),
        ("json", 504, {"error": {"message": "slow"}}, None),
        ("json", 429, {"error": {"message": "rate"}}, {"Retry-After": "0"}),
        ("json", 429, {"error": {"message": "rate"}}, {"Retry-After": _http_date(-5)}),
        "reset",
        "truncate",
    ],
    ids=["500", "502", "503", "504", "429-seconds", "429-date", "reset", "truncated"],
)
@pytest.mark.parametrize("stream", [False, True])
def test_transient_upstream_failures_are_retried_then_succeed(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream, failure: Action, stream: bool
) -> None:
    running = start_proxy(backend="vllm", backend_url=upstream.url, model="served-model", retry=FAST_RETRY)
    session = running.new_session()
    upstream.actions += [failure, failure]
    resp = chat(session, "nonce-1", stream=stream)
    assert resp.status_code == 200, resp.text
    assert upstream.requests == 3
    [record] = session.completions()
    assert record["response_message"]["content"] == "echo: nonce-1"


def test_a_retry_after_beyond_the_deadline_is_not_waited_for(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    running = start_proxy(backend="vllm", backend_url=upstream.url, model="served-model", retry=FAST_RETRY)
    session = running.new_session()
    upstream.actions.append(("json", 429, {"error": {"message": "come back in an hour"}}, {"Retry-After": "3600"}))
    resp = chat(session)
    assert resp.status_code == 504, resp.text
    assert "come back in an hour" in resp.json()["error"]["message"]
    assert upstream.requests == 1 and session.completions() == []


def test_retry_after_parses_seconds_and_http_dates() -> None:
    assert parse_retry_after("7") == 7.0 and parse_retry_after(" 1.5 ") == 1.5
    assert 50 < (parse_retry_after(_http_date(60)) or 0) <= 61
    assert parse_retry_after(_http_date(-60)) == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_hung_upstream_is_bounded_by_the_session_deadline(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream, stream: bool
) -> None:
    running = start_proxy(backend="vllm", backend_url=upstream.url, model="served-model", retry=FAST_RETRY)
    session = running.new_session()
    upstream.actions += ["hang"] * 5
    running.state.registry.set_deadline(session.session_id, time.monotonic() + 1.0)
    try:
        resp = chat(session, stream=stream)
        assert resp.status_code == 504, resp.text
        assert "deadline" in resp.json()["error"]["message"]
        assert session.completions() == []
        again = chat(session)  # the deadline has passed: answered at once, the backend is not called again
        assert again.status_code == 504 and "deadline" in again.json()["error"]["message"]
        assert upstream.requests == 1
    finally:
        upstream.release()


def test_the_per_attempt_timeout_retries_a_hung_attempt(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    running = start_proxy(
        backend="vllm", backend_url=upstream.url, model="served-model", retry=FAST_RETRY, backend_timeout_s=0.3
    )
    session = running.new_session()
    upstream.actions.append("hang")
    try:
        resp = chat(session, "after-a-hang")
        assert resp.status_code == 200, resp.text
        assert upstream.requests == 2
        assert [r["response_message"]["content"] for r in session.completions()] == ["echo: after-a-hang"]
    finally:
        upstream.release()


def test_polar_proxy_flags_set_the_attempt_timeout_and_retries(upstream: Upstream) -> None:
    cmd = [sys.executable, "-m", "polar_cli", "proxy", "--port", "0", "--backend", "vllm", "--backend-url",
           upstream.url, "--model", "served-model", "--backend-timeout", "0.3", "--backend-retries", "1",
           "--control-token", "flags-token"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "POLAR_LOAD_PLUGINS": ""}
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"Polar proxy on (http://\S+)", first)
        assert match, first
        auth = {"Authorization": "Bearer flags-token"}
        info = httpx.post(f"{match.group(1)}/sessions", json={"session_id": "flags"}, headers=auth).json()
        session = ProxySession(None, "flags", info["api_key"], info["base_urls"])  # type: ignore[arg-type]
        upstream.actions += ["hang", "hang"]
        resp = chat(session)  # 0.3 s per attempt, 2 attempts: a 504 from the proxy, not a 600 s wait
        assert resp.status_code == 504 and upstream.requests == 2, resp.text
        upstream.actions += [("json", 503, {"error": {"message": "busy"}}, None)] * 3
        resp = chat(session)  # one retry, then the upstream's status
        assert resp.status_code == 503 and "after 2 attempts" in resp.text and upstream.requests == 4
    finally:
        upstream.release()
        proc.kill()
        proc.communicate()


def test_polar_proxy_rejects_a_bad_backend_timeout() -> None:
    cmd = [sys.executable, "-m", "polar_cli", "proxy", "--backend-timeout", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "POLAR_LOAD_PLUGINS": ""})
    assert done.returncode != 0 and "backend_timeout_s" in done.stderr + done.stdout
