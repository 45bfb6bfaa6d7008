"""Shared proxy fixtures: a real proxy on port 0 (scripted backend, demo tokenizer), sessions, completions.

The proxy runs on its own event loop in a background thread so tests can drive it with the official (sync) SDKs.

- ``demo_tokenizer``: path of the demo tokenizer, built once per test run.
- ``proxy``: a session-wide running proxy (scripted backend, journal in a tmp dir) — a :class:`RunningProxy`.
- ``start_proxy``: a factory for a proxy with other settings (``start_proxy(backend="vllm", backend_url=...)``).
- ``RunningProxy.new_session(script=[...])`` → :class:`ProxySession` with ``api_key``, ``openai_base``,
  ``anthropic_base``, ``google_base`` and ``completions()`` (the recorded Completions as dicts, in order).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from aiohttp import web

from polar_cli.proxy.app import create_proxy_app
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.state import ProxyState
from polar_cli.web.listen import Listener, listen
from tests.support.stacks import task_stacks

T = TypeVar("T")


@dataclass
class ProxySession:
    """One session on a running proxy, with what a harness would be given."""

    proxy: RunningProxy
    session_id: str
    api_key: str
    base_urls: dict[str, str]

    @property
    def openai_base(self) -> str:
        return self.base_urls["openai"]

    @property
    def anthropic_base(self) -> str:
        return self.base_urls["anthropic"]

    @property
    def google_base(self) -> str:
        return self.base_urls["google"]

    def completions(self) -> list[dict[str, Any]]:
        return self.proxy.completions(self.session_id)


class LoopThread:
    """An asyncio loop in a daemon thread, serving aiohttp apps on 127.0.0.1 port 0."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="polar-test-loop", daemon=True)
        self._thread.start()
        self._listeners: list[Listener] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def serve(self, app: web.Application) -> str:
        """Serve ``app`` and return its base URL."""

        async def start() -> str:
            listener = await listen(app, "127.0.0.1", 0)
            self._listeners.append(listener)
            return listener.url

        return self.run(start())

    def where(self) -> str:
        """The loop thread's stack and every task's stack, as they are now (for a failure message)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        thread = "".join(traceback.format_stack(frame)) if frame is not None else "(the loop thread has ended)\n"
        return thread + task_stacks(self.loop)

    def close(self) -> None:
        for listener in reversed(self._listeners):
            self.run(listener.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class RunningProxy:
    """A proxy served from a background thread's event loop."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.loop_thread = LoopThread()
        self.state: ProxyState = self.run(self._make_state())
        self.url = self.loop_thread.serve(create_proxy_app(self.config, self.state))
        self.state.base_url = self.url
        # the operator's client: it knows the control token (``anonymous()`` is another local user's)
        self.http = httpx.Client(base_url=self.url, timeout=30, headers=self.control_headers)

    @property
    def control_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.control_token}"}

    async def _make_state(self) -> ProxyState:
        return ProxyState(self.config)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the proxy's loop and wait for it."""
        return self.loop_thread.run(coro)

    def new_session(self, script: list[dict[str, Any]] | None = None, **body: Any) -> ProxySession:
        if script is not None:
            body["script"] = script
        resp = self.http.post("/sessions", json=body)
        assert resp.status_code == 201, resp.text
        data = resp.json()
        return ProxySession(self, data["session_id"], data["api_key"], data["base_urls"])

    def completions(self, session_id: str) -> list[dict[str, Any]]:
        try:
            resp = self.http.get(f"/sessions/{session_id}/completions")
        except httpx.TimeoutException as exc:  # the proxy's loop did not answer: say where it was
            raise AssertionError(f"the proxy did not answer in 30 s; its loop:\n{self.loop_thread.where()}") from exc
        assert resp.status_code == 200, resp.text
        result: list[dict[str, Any]] = resp.json()
        return result

    def close(self) -> None:
        self.http.close()
        self.loop_thread.close()


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from polar_cli.demo_model import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("demo-tokenizer"))


@pytest.fixture(scope="session")
def start_proxy(
    demo_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., RunningProxy]]:
    """Factory: ``start_proxy(**ProxyConfig fields)``; scripted + demo tokenizer + a fresh journal dir by default."""
    started: list[RunningProxy] = []

    def start(**overrides: Any) -> RunningProxy:
        settings: dict[str, Any] = {"backend": "scripted", "journal_dir": tmp_path_factory.mktemp("journal")}
        if overrides.get("backend", "scripted") == "scripted":
            settings["tokenizer"] = str(demo_tokenizer)
        settings.update(overrides)
        running = RunningProxy(ProxyConfig(**settings))
        started.append(running)
        return running

    yield start
    for running in started:
        running.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    """A background loop for test peers (e.g. a fake vLLM server): ``loop_thread.serve(app)`` → URL."""
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="session")
def proxy(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    """The shared proxy: scripted backend, demo tokenizer, journal on disk. Make your own session per test."""
    return start_proxy()


@pytest.fixture(scope="session")
def synthetic_proxy(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    """Like ``proxy``, with ``stream_mode="synthetic"``: a stream is the whole answer replayed as the codec's exact
    event sequence (the default, pass-through, streams the scripted turn in vLLM-shaped pieces)."""
    return start_proxy(stream_mode="synthetic")


C = TypeVar("C")
_OPEN_CLIENTS: list[Any] = []


def closing(client: C) -> C:
    """``client`` (an SDK client), closed when the test ends: a pooled keep-alive socket left to the garbage collector
    is a ResourceWarning, which pytest reports in whichever later test the collection happens to run."""
    _OPEN_CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    yield
    while _OPEN_CLIENTS:
        _OPEN_CLIENTS.pop().close()
