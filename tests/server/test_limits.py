"""Hostile input on a real ``polar serve`` (server and embedded gateway, the scripted backend): every bound of
docs/service.md "Limits" is a 400 in the server's error shape, and the service keeps answering afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from polar_cli.gateway.config import GatewayConfig
from polar_cli.models.limits import MAX_NUM_SAMPLES, MAX_TOKEN_LENGTH, MAX_URL_LENGTH
from polar_cli.node_protocol import GatewayClient
from polar_cli.server.store import NodeRow
from tests.server.procs import Serve, serve_config, waiting_task


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("limits")
    proc = Serve(root / "polar-data", "--port", "0", "--config", str(serve_config(root, "serve")))
    try:
        yield asyncio.run(proc.ready())
    finally:
        proc.stop()


def _client(info: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {info['token']}"}, timeout=30)


def _refused(response: httpx.Response, field: str) -> None:
    """A 400 in the server's error shape, naming ``field``."""
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert field in error["message"] and error["type"], error


def _healthy_within_a_second(info: dict[str, Any]) -> None:
    with httpx.Client(base_url=info["url"], timeout=1.0) as stranger:
        assert stranger.get("/healthz").json() == {"ok": True}


@pytest.mark.parametrize("num_samples", [2**31, "18446744073709551616", 2**63, MAX_NUM_SAMPLES + 1, 0])
def test_num_samples_past_its_bound_is_refused_and_the_server_stays_up(
    serve: dict[str, Any], num_samples: int | str
) -> None:
    body = waiting_task(f"big-{num_samples}"[:40], 1)
    body["num_samples"] = num_samples
    with _client(serve) as http:
        _refused(http.post("/rollout/task/submit", json=body), "num_samples")
    _healthy_within_a_second(serve)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("task_id", "t" * 257),
        ("timeout_seconds", "inf"),
        ("timeout_seconds", 1e9),
        ("callback_url", "ftp://example.com/x"),
        ("callback_url", "http://127.0.0.1:9/" + "a" * MAX_URL_LENGTH),
        ("max_staleness", 2**63),
    ],
)
def test_other_task_bounds_are_refused(serve: dict[str, Any], field: str, value: object) -> None:
    body = waiting_task("bounded", 1)
    body[field] = value
    with _client(serve) as http:
        _refused(http.post("/rollout/task/submit", json=body), field)


def test_a_long_poll_past_its_bound_is_refused(serve: dict[str, Any]) -> None:
    with _client(serve) as http:
        for wait in ("inf", "nan", "3601"):
            _refused(http.get("/rollout/task/nope", params={"wait": wait}), "wait")


def _register(url: str, token: str) -> dict[str, Any]:
    return {"url": url, "token": token, "node_id": "hostile", "capacity": {"run_slots": 1}}


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("token", _register("http://127.0.0.1:9", "tökén")),
        ("token", _register("http://127.0.0.1:9", "a b")),
        ("token", _register("http://127.0.0.1:9", "t" * (MAX_TOKEN_LENGTH + 1))),
        ("url", _register("http://127.0.0.1:9/" + "a" * 70 * 1024, "tok")),
        ("url", _register("http://127.0.0.1:99999", "tok")),
        ("url", _register("file:///etc/passwd", "tok")),
        ("url", _register("http://", "tok")),
        ("run_slots", {**_register("http://127.0.0.1:9", "tok"), "capacity": {"run_slots": 2**63}}),
    ],
    ids=["non-ascii-token", "token-with-space", "long-token", "70-KiB-url", "bad-port", "file-url", "no-host", "slots"],
)
def test_a_hostile_node_registration_is_refused_and_the_pool_and_dispatch_still_work(
    serve: dict[str, Any], field: str, body: dict[str, Any]
) -> None:
    with _client(serve) as http:
        _refused(http.post("/nodes/register", json=body), field)
        pools = http.get("/inference")
        assert pools.status_code == 200, pools.text[:500]
        assert [g["node_id"] for g in pools.json()["gateways"]] == [serve["node_id"]]
        task_id = f"after-{field}-{len(str(body))}"
        submitted = http.post("/rollout/task/submit", json=waiting_task(task_id, 1))
        assert submitted.status_code == 200, submitted.text[:500]
        status = http.get(f"/rollout/task/{task_id}", params={"wait": 60}).json()
    assert status["state"] == "completed", status


def test_heartbeat_and_callback_bounds_are_refused(serve: dict[str, Any]) -> None:
    node = {"Authorization": f"Bearer {serve['node_token']}"}
    with httpx.Client(base_url=serve["url"], headers=node, timeout=30) as http:
        heartbeat = f"/nodes/{serve['node_id']}/heartbeat"
        _refused(http.post(heartbeat, json={"load": {"running": 2**63}}), "running")
        result = {"node_id": serve["node_id"], "session_id": "s", "attempt": 2**63, "result": {}}
        _refused(http.post("/callbacks/session_result", json=result), "attempt")


@pytest.mark.parametrize(
    ("url", "token"),
    [
        ("http://127.0.0.1:9", "tökén"),  # UnicodeEncodeError in the header
        ("http://127.0.0.1:9/" + "a" * 70 * 1024, "tok"),  # httpx.InvalidURL
        ("http://127.0.0.1:99999", "tok"),  # an OverflowError inside an ExceptionGroup
        ("http://exa mple/", "tok"),  # httpx.InvalidURL
        ("http://127.0.0.1:9", "a\nb"),  # httpx.LocalProtocolError
    ],
    ids=["non-ascii-token", "70-KiB-url", "bad-port", "space-in-host", "newline-in-token"],
)
def test_the_node_client_answers_any_node_error_as_that_nodes_reply(url: str, token: str) -> None:
    """A node registered before the bounds existed (rows in an older data dir) still never turns a route into a 500."""
    node = NodeRow(node_id="old", url=url, token=token, run_slots=1, draining=False)

    async def ask() -> None:
        async with GatewayClient(timeout=5) as gateways:
            reply = await gateways.inference(node)
        assert reply.status is None and reply.answer is None and reply.error, reply

    asyncio.run(ask())


@pytest.mark.parametrize("token", ["tökén", "a b", "t" * (MAX_TOKEN_LENGTH + 1)])
def test_a_gateway_refuses_at_start_a_token_the_server_would_refuse(token: str) -> None:
    """Not a registration retried forever: the gateway's own config names the field."""
    with pytest.raises(ValidationError, match="control_token"):
        GatewayConfig(control_token=token)
