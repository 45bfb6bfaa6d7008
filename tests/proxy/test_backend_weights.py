"""The weight-update hooks of the HTTP backends against a small aiohttp peer answering like the server would, where the
real server cannot run here: SGLang has no CPU build for this suite, so its pause, continue and
``update_weights_from_disk`` are checked against its documented answers; for vLLM, what a server started without
``VLLM_SERVER_DEV_MODE=1`` (404s) or with ``--logprobs-mode`` set answers, and a control call that hangs. What vLLM
itself does with these calls is in tests/proxy/test_vllm_weights.py."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from polar_cli.errors import BackendError
from polar_cli.proxy.backends.http import HttpChatClient
from polar_cli.registry import get_backend

from .conftest import LoopThread

T = TypeVar("T")


class ControlPeer:
    """A fake inference server: answers ``routes[path]`` = (status, JSON body, delay s), 404 for any other path, and
    remembers each call as (path with query, JSON body or None)."""

    def __init__(self, loop_thread: LoopThread, routes: dict[str, tuple[int, Any, float]]) -> None:
        self.routes = routes
        self.calls: list[tuple[str, Any]] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.url = loop_thread.serve(app)
        self.loop_thread = loop_thread

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.calls.append((request.path_qs, await request.json() if raw else None))
        if request.path not in self.routes:
            return web.json_response({"detail": "Not Found"}, status=404)
        status, body, delay = self.routes[request.path]
        await asyncio.sleep(delay)
        return web.json_response(body, status=status)

    def run(self, backend: str, work: Callable[[HttpChatClient], Awaitable[T]], **config: Any) -> T:
        async def go() -> T:
            client = get_backend(backend).client(url=self.url + "/v1", model="m", **config)
            assert isinstance(client, HttpChatClient)
            try:
                return await work(client)
            finally:
                await client.close()

        return self.loop_thread.run(go())


OK = (200, {"message": "ok", "status": "ok"}, 0.0)
LOADED = {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
SGLANG = {"/pause_generation": OK, "/continue_generation": OK, "/update_weights_from_disk": (200, LOADED, 0.0)}


def test_sglang_pauses_by_retracting_loads_from_disk_and_continues(loop_thread: LoopThread) -> None:
    peer = ControlPeer(loop_thread, SGLANG)

    async def work(client: HttpChatClient) -> bool:
        paused = await client.pause_generation(5)
        await client.reload_weights("/ckpt/step-2", 5)
        await client.resume_generation(5)
        return paused

    assert peer.run("sglang", work) is True
    assert peer.calls == [("/pause_generation", {"mode": "retract"}),
                          ("/update_weights_from_disk", {"model_path": "/ckpt/step-2"}),
                          ("/continue_generation", {})]  # fmt: skip


@pytest.mark.parametrize("status", [400, 200])
def test_sglang_update_weights_answering_success_false_is_an_error_naming_the_server(
    loop_thread: LoopThread, status: int
) -> None:
    """SGLang answers a failed load with HTTP 400 and ``success: false``; a 200 saying so is a failure too."""
    failed = {"success": False, "message": "Failed to get weights iterator: no safetensors", "num_paused_requests": 0}
    peer = ControlPeer(loop_thread, {"/update_weights_from_disk": (status, failed, 0)})
    with pytest.raises(BackendError) as info:
        peer.run("sglang", lambda client: client.reload_weights("/ckpt/empty", 5))
    message = str(info.value)
    assert peer.url in message and "/ckpt/empty" in message and "no safetensors" in message
    assert info.value.status == (400 if status == 400 else 502)


def test_sglang_without_the_pause_route_has_no_pause(loop_thread: LoopThread) -> None:
    peer = ControlPeer(loop_thread, {})
    assert peer.run("sglang", lambda client: client.pause_generation(5)) is False


def test_vllm_without_dev_mode_has_no_pause_and_cannot_load_weights(loop_thread: LoopThread) -> None:
    """A vLLM server started without VLLM_SERVER_DEV_MODE=1 has none of these routes (404)."""
    peer = ControlPeer(loop_thread, {"/v1/models": (200, {"data": [{"id": "m"}]}, 0)})

    async def work(client: HttpChatClient) -> tuple[bool, str | None]:
        paused = await client.pause_generation(5)
        await client.resume_generation(5)
        await client.preflight(5)
        return paused, client.logprobs_mode

    assert peer.run("vllm", work) == (False, "raw")  # vLLM's default logprobs mode when the server does not say
    with pytest.raises(BackendError) as info:
        peer.run("vllm", lambda client: client.reload_weights("/ckpt/step-2", 5))
    assert info.value.status == 409
    assert peer.url in str(info.value) and "VLLM_SERVER_DEV_MODE=1" in str(info.value)


@pytest.mark.parametrize(("served", "mode"), [("processed_logprobs", "processed"), ("raw_logprobs", "raw")])
def test_vllm_takes_the_servers_logprobs_mode(loop_thread: LoopThread, served: str, mode: str) -> None:
    info = {"vllm_config": {"model_config": {"logprobs_mode": served}}}
    peer = ControlPeer(loop_thread, {"/v1/models": (200, {"data": [{"id": "m"}]}, 0), "/server_info": (200, info, 0)})

    async def work(client: HttpChatClient) -> str | None:
        await client.preflight(5)
        return client.logprobs_mode

    assert peer.run("vllm", work) == mode
    assert peer.run("vllm", work, logprobs_mode="raw") == "raw"  # configured: the server is not asked
    assert [path for path, _ in peer.calls].count("/server_info?config_format=json") == 1


def test_a_vllm_server_returning_logits_is_refused(loop_thread: LoopThread) -> None:
    info = {"vllm_config": {"model_config": {"logprobs_mode": "processed_logits"}}}
    peer = ControlPeer(loop_thread, {"/v1/models": (200, {"data": [{"id": "m"}]}, 0), "/server_info": (200, info, 0)})
    with pytest.raises(BackendError, match="processed_logits") as raised:
        peer.run("vllm", lambda client: client.preflight(5))
    assert peer.url in str(raised.value)


def test_a_control_call_that_hangs_times_out_naming_the_server(loop_thread: LoopThread) -> None:
    peer = ControlPeer(loop_thread, {"/pause": (200, {"status": "paused"}, 5.0)})
    with pytest.raises(BackendError) as info:
        peer.run("vllm", lambda client: client.pause_generation(0.2))
    assert info.value.status == 504 and peer.url in str(info.value) and "0.2 s" in str(info.value)


def test_vllm_warns_when_a_checkpoint_ties_its_output_layer(
    loop_thread: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's in-place reload keeps a tied lm_head at its start weights (.ci/VLLM_NOTES.md): loading such a checkpoint
    still goes ahead, with a warning naming the cause and the way out; an untied one loads without it."""
    tied, untied = tmp_path / "tied", tmp_path / "untied"
    for folder, tie in ((tied, True), (untied, False)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": tie}))
    peer = ControlPeer(loop_thread, {"/collective_rpc": OK, "/reset_prefix_cache": OK})
    logger = "polar_cli.proxy.backends.vllm"
    with caplog.at_level(logging.WARNING, logger=logger):
        peer.run("vllm", lambda client: client.reload_weights(str(untied), 5))
        assert not [r for r in caplog.records if r.name == logger]
        peer.run("vllm", lambda client: client.reload_weights(str(tied), 5))
    [record] = [r for r in caplog.records if r.name == logger]
    assert str(tied) in record.getMessage() and "tie_word_embeddings: false" in record.getMessage()
    assert [path for path, _ in peer.calls].count("/collective_rpc") == 2  # it warns, it does not refuse
