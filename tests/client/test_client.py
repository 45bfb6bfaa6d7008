"""PolarClient and AsyncPolarClient against a real ``polar serve``: the shell harness runs a small Python agent that
calls the scripted backend through the embedded gateway's proxy (the agent of tests/gateway/test_node.py)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from polar_cli.client import AsyncPolarClient, PolarClient
from polar_cli.errors import AuthError, ConfigError, ServiceUnavailableError, SessionError, SessionExistsError
from polar_cli.models import TRAINER_CALLBACK, SessionResult, SessionResultCallback, TaskStatus
from tests.client.conftest import Served
from tests.gateway.sim import until
from tests.gateway.test_node import task


def test_submit_results_wait_and_idempotent_resubmit(served: Served) -> None:
    two = task("client-two", {}, num_samples=2)
    with PolarClient(served.url, served.token) as client:
        answer = client.submit(two)
        assert answer.task_id == "client-two" and answer.status in ("pending", "running")
        results = list(client.results("client-two"))
        final = client.wait("client-two")
        again = client.submit(two)  # the same body: the same task, nothing new runs
    assert sorted(r.session_id for r in results) == sorted(final.sessions)  # each session's result exactly once
    assert {r.sample_index for r in results} == {0, 1}
    assert all((r.status, r.reward, r.num_completions) == ("completed", 1.0, 2) for r in results)
    assert (final.state, final.completed, final.failed, final.num_samples) == ("completed", 2, 0, 2)
    assert sorted(final.results, key=lambda r: r.sample_index) == sorted(results, key=lambda r: r.sample_index)
    assert (again.task_id, again.status) == ("client-two", "completed")


def test_submit_a_task_file_and_a_mapping(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task("client-file", {}).model_dump(mode="json")))
    with PolarClient(served.url, served.token) as client:
        assert client.submit(path).task_id == "client-file"
        assert client.submit(str(path)).task_id == "client-file"  # same body again
        assert client.submit(task("client-map", {}).model_dump()).task_id == "client-map"
        assert client.wait("client-file").state == "completed"
        assert client.wait("client-map").state == "completed"
        with pytest.raises(ConfigError, match="num_sample"):
            client.submit({**task("client-bad", {}).model_dump(), "num_sample": 2})


def test_a_task_without_an_id_is_a_new_task_each_time_and_task_id_names_it(served: Served, tmp_path: Path) -> None:
    data = task("unused", {}).model_dump(mode="json")
    del data["task_id"]
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    with PolarClient(served.url, served.token) as client:
        first, second = client.submit(path), client.submit(path)
        assert first.task_id != second.task_id and first.created and second.created
        assert first.task_id.startswith("task-") and second.task_id.startswith("task-")
        named = client.submit(path, task_id="client-named")
        assert (named.task_id, named.created) == ("client-named", True)
        assert client.wait("client-named").state == "completed"
        again = client.submit(data, task_id="client-named")  # the same body under the same id: the same task
        assert (again.task_id, again.status, again.created) == ("client-named", "completed", False)
        with pytest.raises(SessionExistsError, match="exists with a different body: submit this one under another"):
            client.submit({**data, "num_samples": 2}, task_id="client-named")
        with pytest.raises(ConfigError, match="task_id"):
            client.submit(data, task_id="")
        assert {client.wait(a.task_id).state for a in (first, second)} == {"completed"}

    async def body() -> tuple[str, bool]:
        async with AsyncPolarClient(served.url, served.token) as client:
            answer = await client.submit(path, task_id="client-async-named")
            await client.wait(answer.task_id)
            again = await client.submit(path, task_id="client-async-named")
            return again.task_id, again.created

    assert asyncio.run(body()) == ("client-async-named", False)


def test_wait_with_a_timeout_returns_the_running_task_and_cancel_ends_it(served: Served) -> None:
    hang = task("client-hang", {"CALLS": "1", "HANG": "1"}, num_samples=2)
    with PolarClient(served.url, served.token) as client:
        client.submit(hang)
        early = client.wait("client-hang", timeout=0.2)
        assert early.state in ("pending", "running")
        cancelled = client.cancel("client-hang")
        final = client.wait("client-hang")
        results = list(client.results("client-hang"))  # a task that has ended: its results, then the iterator ends
    assert cancelled.task_id == "client-hang"
    assert final.state == "cancelled"
    assert set(final.sessions.values()) <= {"cancelled", "finished"}
    assert sorted(r.session_id for r in results) == sorted(r.session_id for r in final.results)


def test_errors_map_to_polar_errors(served: Served) -> None:
    with PolarClient(served.url, "not-the-token") as client, pytest.raises(AuthError):
        client.service_status()
    with PolarClient(served.url, served.token) as client:
        with pytest.raises(SessionError) as unknown:
            client.status("no-such-task")
        assert not isinstance(unknown.value, SessionExistsError) and "HTTP 404" in str(unknown.value)
        client.submit(task("client-conflict", {}))
        with pytest.raises(SessionExistsError, match="HTTP 409"):
            client.submit(task("client-conflict", {}, instruction="something else"))
        client.wait("client-conflict")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens once the socket is closed
    with PolarClient(f"127.0.0.1:{closed}", served.token) as client, pytest.raises(ServiceUnavailableError) as refused:
        client.service_status()
    assert f"cannot reach the Polar server at http://127.0.0.1:{closed}" in str(refused.value)


def test_url_and_token_from_the_environment(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_SERVER", served.url)
    monkeypatch.setenv("POLAR_TOKEN", served.token)
    with PolarClient() as client:
        status = client.service_status()
    assert client.url == served.url
    assert status.nodes and all(node.healthy and not node.draining for node in status.nodes)
    monkeypatch.delenv("POLAR_SERVER")
    with pytest.raises(ConfigError, match="POLAR_SERVER"):
        PolarClient()


def test_async_client(served: Served) -> None:
    async def body() -> tuple[list[SessionResult], TaskStatus, TaskStatus]:
        async with AsyncPolarClient(served.url, served.token) as client:
            await client.submit(task("client-async", {}, num_samples=2))
            results = [r async for r in client.results("client-async")]
            final = await client.wait("client-async")
            with pytest.raises(SessionError):
                await client.cancel("no-such-task")
            return results, final, await client.status("client-async")

    results, final, status = asyncio.run(body())
    assert sorted(r.session_id for r in results) == sorted(final.sessions)
    assert final.state == "completed" and status == final


def test_a_trainer_receives_callbacks_and_drops_repeats_by_idempotency_key(served: Served) -> None:
    """The receiver of docs/service.md: typed bodies, each key handled once, a failed acknowledgement sent again."""
    seen: set[str] = set()
    deliveries: list[str] = []
    sessions: list[SessionResult] = []
    finals: list[TaskStatus] = []

    async def receive(request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        deliveries.append(key)
        if key not in seen:
            event = TRAINER_CALLBACK.validate_json(await request.read())
            if isinstance(event, SessionResultCallback):
                sessions.append(event.result)
            else:
                finals.append(event.status)
            seen.add(key)
            if key.startswith("task_status:"):
                return web.json_response({"ok": False}, status=503)  # handled, but the answer is lost: sent again
        return web.json_response({"ok": True})

    async def body() -> TaskStatus:
        app = web.Application()
        app.router.add_post("/polar/callback", receive)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        callback_url = f"http://127.0.0.1:{runner.addresses[0][1]}/polar/callback"
        try:
            async with AsyncPolarClient(served.url, served.token) as client:
                await client.submit(task("client-callback", {}, num_samples=2, callback_url=callback_url))
                final = await client.wait("client-callback")
                await until(lambda: deliveries.count("task_status:client-callback") >= 2, "the repeated task_status")
                return final
        finally:
            await runner.cleanup()

    final = asyncio.run(body())
    assert sorted(r.session_id for r in sessions) == sorted(final.sessions)
    assert [f.task_id for f in finals] == ["client-callback"] and finals[0].state == "completed"
    assert {f"session_result:{s}" for s in final.sessions} <= set(deliveries)
