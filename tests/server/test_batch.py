"""Batch dispatch (``POST /sessions/batch``): a real ``polar serve`` server sends all the sessions it chose for a node
in one call; a real gateway takes them; sessions a gateway refuses in a batch are dispatched again."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from polar_cli.models import SessionResult, TaskStatus, Trajectory
from polar_cli.node_protocol import SessionBatch
from tests.server.procs import Serve, client, gateway, serve_config, until_true, waiting_task
from tests.server.test_service import finished, one_result_per_sample


def test_a_real_gateway_takes_a_batch_and_the_server_dispatches_a_task_through_it(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    gateways: list[Serve] = []

    async def body() -> None:
        info = await server.ready()
        gateways.append(gateway(tmp_path, "gw", info, config, "token-gw"))
        node = await gateways[0].ready()
        # the route itself, called as the server calls it: each task once, one answer per session in order
        spec = waiting_task("direct", 2)
        sessions = [{"task_id": "direct", "sample_index": i, "session_id": f"direct-{i}", "attempt": 1}
                    for i in range(2)]  # fmt: skip
        sessions.append({"task_id": "not-sent", "sample_index": 0, "session_id": "orphan-0"})
        batch = {"tasks": {"direct": spec}, "sessions": sessions}
        async with httpx.AsyncClient(base_url=node["gateway_url"], timeout=60) as http:
            unauthorized = await http.post("/sessions/batch", json=batch)
            assert unauthorized.status_code == 401
            headers = {"Authorization": "Bearer token-gw"}
            answer = (await http.post("/sessions/batch", json=batch, headers=headers)).json()
            assert [(a["session_id"], a["accepted"], a["status"]) for a in answer["sessions"]] == [
                ("direct-0", True, 201), ("direct-1", True, 201), ("orphan-0", False, 400)]  # fmt: skip
            again = (await http.post("/sessions/batch", json=batch, headers=headers)).json()
            assert [a["accepted"] for a in again["sessions"]] == [False, False, False]  # the ids are taken
            for i in range(2):
                described = (await http.get(f"/sessions/direct-{i}", headers=headers)).json()
                assert described["sample_index"] == i
        # through the server: a five-sample task, every sample once
        async with client(info) as http:
            submitted = await http.post("/rollout/task/submit", json=waiting_task("five", 5))
            assert submitted.status_code == 200
        results = one_result_per_sample(await finished(info, "five"), 5)
        assert {r.metadata["node_id"] for r in results} == {node["node_id"]}
        assert {r.metadata["polar_attempt"] for r in results} == {1}

    try:
        asyncio.run(body())
    finally:
        for process in [*gateways, server]:
            process.stop()


class PickyGateway:
    """A gateway speaking the node side of docs/service.md that refuses some sessions the first time a batch brings
    them: sample 1 with 503 (as a draining gateway would), sample 2 with 500; it takes everything else and reports
    each session it takes as completed."""

    def __init__(self, server: dict[str, Any]) -> None:
        self.server = server
        self.token = secrets.token_urlsafe(16)
        self.node_id = ""
        self.held: dict[str, tuple[str, int, int]] = {}
        self.batches: list[list[tuple[str, int, bool]]] = []  # (session_id, attempt, accepted) per batch
        self.refused: set[int] = set()
        self.single_posts = 0
        self.silent = False
        """Set to stop its heartbeats (a gateway that looks dead to the server)."""
        self.runner: web.AppRunner | None = None
        self.work: set[asyncio.Task[Any]] = set()
        self.http = httpx.AsyncClient(base_url=server["url"], timeout=30)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/sessions/batch", self._batch)
        app.router.add_post("/sessions", self._single)
        app.router.add_get("/sessions/{session_id}", self._get)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        body = {"url": url, "token": self.token, "capacity": {"run_slots": 8}, "held_results": []}
        answer = await self.http.post("/nodes/register", json=body, headers=self._auth(self.server["token"]))
        answer.raise_for_status()
        self.node_id = answer.json()["node_id"]
        self._spawn(self._heartbeats(float(answer.json()["heartbeat_interval_s"])))

    def _auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.work.add(task)
        task.add_done_callback(self.work.discard)

    async def _heartbeats(self, interval: float) -> None:
        while True:
            if not self.silent:
                load = {"run_slots": 8, "running": len(self.held), "queued": 0, "free_slots": 8}
                body = {"load": load, "sessions": list(self.held)}
                with contextlib.suppress(httpx.HTTPError):
                    await self.http.post(f"/nodes/{self.node_id}/heartbeat", json=body, headers=self._auth(self.token))
            await asyncio.sleep(interval)

    async def _batch(self, request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == f"Bearer {self.token}"
        batch = SessionBatch.model_validate_json(await request.read())
        answers, seen = [], []
        for spec in batch.sessions:
            refuse = {1: 503, 2: 500}.get(spec.sample_index) if spec.sample_index not in self.refused else None
            seen.append((spec.session_id, spec.attempt or 0, refuse is None))
            if refuse is not None:
                self.refused.add(spec.sample_index)
                answers.append({"session_id": spec.session_id, "accepted": False, "status": refuse, "error": "not now"})
                continue
            self.held[spec.session_id] = (spec.task_id, spec.sample_index, spec.attempt or 1)
            self._spawn(self._report(spec.session_id))
            answers.append({"session_id": spec.session_id, "accepted": True, "status": 201})
        self.batches.append(seen)
        return web.json_response({"sessions": answers})

    async def _single(self, request: web.Request) -> web.Response:
        self.single_posts += 1
        return web.json_response({"error": {"message": "batches only", "type": "invalid_request"}}, status=500)

    async def _get(self, request: web.Request) -> web.Response:
        session_id = request.match_info["session_id"]
        if session_id not in self.held:
            return web.json_response({"error": {"message": "unknown", "type": "not_found"}}, status=404)
        return web.json_response({"session_id": session_id, "stage": "run"})

    async def _report(self, session_id: str) -> None:
        await asyncio.sleep(0.2)
        task_id, sample_index, attempt = self.held[session_id]
        trajectory = Trajectory(session_id=session_id, status="completed")
        result = SessionResult(session_id=session_id, task_id=task_id, sample_index=sample_index, status="completed",
                               reward=1.0, trajectory=trajectory)  # fmt: skip
        body = {"node_id": self.node_id, "session_id": session_id, "attempt": attempt,
                "result": result.model_dump(mode="json")}  # fmt: skip
        answer = await self.http.post("/callbacks/session_result", json=body, headers=self._auth(self.token))
        assert answer.status_code == 200, answer.text
        self.held.pop(session_id, None)

    async def close(self) -> None:
        for task in list(self.work):
            task.cancel()
        await asyncio.gather(*self.work, return_exceptions=True)
        await self.http.aclose()
        if self.runner is not None:
            await self.runner.cleanup()


def test_sessions_a_gateway_refuses_in_a_batch_are_dispatched_again(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))

    async def body() -> None:
        info = await server.ready()
        picky = PickyGateway(info)
        await picky.start()
        try:
            async with client(info) as http:
                submitted = await http.post("/rollout/task/submit", json=waiting_task("four", 4))
                assert submitted.status_code == 200
            status: TaskStatus = await finished(info, "four")
        finally:
            await picky.close()
        assert status.state == "completed" and status.completed == 4
        results = sorted(status.results, key=lambda r: r.sample_index)
        assert [r.sample_index for r in results] == [0, 1, 2, 3]  # each sample exactly once
        assert len({r.session_id for r in results}) == 4 and set(status.sessions.values()) == {"finished"}
        assert picky.single_posts == 0  # everything went through the batch route
        first = picky.batches[0]
        assert len(first) == 4  # the task's four sessions in one call
        sent = Counter(session_id for batch in picky.batches for session_id, _, _ in batch)
        by_sample = {r.sample_index: r for r in results}
        assert sent[by_sample[1].session_id] == 2 and sent[by_sample[2].session_id] == 2  # refused once, sent again
        assert sent[by_sample[0].session_id] == 1 and sent[by_sample[3].session_id] == 1
        # a 503 is not an attempt (the session goes back to pending as it was); a 500 is: the next one is attempt 2
        assert by_sample[1].metadata["polar_attempt"] == 1
        assert by_sample[2].metadata["polar_attempt"] == 2
        assert by_sample[0].metadata["polar_attempt"] == 1

    try:
        asyncio.run(body())
    finally:
        server.stop()


class HeldGateway(PickyGateway):
    """A gateway that holds its first batch unanswered until ``release``, then answers it with ``status`` for every
    session; later batches it takes as PickyGateway does. ``silent`` stops its heartbeats."""

    def __init__(self, server: dict[str, Any], status: int) -> None:
        super().__init__(server)
        self.status = status
        self.release = asyncio.Event()

    async def _batch(self, request: web.Request) -> web.Response:
        if self.batches:
            return await super()._batch(request)
        batch = SessionBatch.model_validate_json(await request.read())
        self.batches.append([(spec.session_id, spec.attempt or 0, self.status == 201) for spec in batch.sessions])
        await self.release.wait()
        if self.status == 201:
            for spec in batch.sessions:
                self.held[spec.session_id] = (spec.task_id, spec.sample_index, spec.attempt or 1)
        answers = [{"session_id": spec.session_id, "accepted": self.status == 201, "status": self.status}
                   for spec in batch.sessions]  # fmt: skip
        return web.json_response({"sessions": answers})

    async def register_again(self) -> None:
        """Register as the same node (a restarted gateway), holding no results."""
        assert self.runner is not None
        url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        body = {"url": url, "token": self.token, "node_id": self.node_id, "capacity": {"run_slots": 8},
                "held_results": []}  # fmt: skip
        answer = await self.http.post("/nodes/register", json=body, headers=self._auth(self.server["token"]))
        answer.raise_for_status()


@pytest.mark.parametrize(
    ("event", "status", "attempt"),
    [("dies", 503, 1), ("dies", 201, 2), ("registers again", 503, 1)],
)
def test_a_session_being_sent_when_its_node_dies_or_registers_again_counts_only_if_it_got_there(
    tmp_path: Path, event: str, status: int, attempt: int
) -> None:
    """The server declares a node dead (or hears it restarted) while a batch to it is unanswered: the send decides.
    A send that did not get there (503, or no answer) is not an attempt; one the dead node took is lost there."""
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(serve_config(tmp_path, "s")))

    async def body() -> None:
        info = await server.ready()
        held = HeldGateway(info, status)
        others: list[PickyGateway] = []
        await held.start()
        try:
            async with client(info) as http:
                await http.post("/rollout/task/submit", json=waiting_task("in-flight", 1))
                await until_true(lambda: asyncio.sleep(0, bool(held.batches)), "the batch sent")
                if event == "dies":
                    held.silent = True

                    async def dead() -> bool:
                        nodes = (await http.get("/rollout/status")).json()["nodes"]
                        return not nodes[0]["healthy"]

                    await until_true(dead, "the node declared dead")
                    others.append(PickyGateway(info))
                    await others[0].start()
                else:
                    await held.register_again()
                await asyncio.sleep(1)  # heartbeats and the dispatcher had their turn
                held.release.set()
                status_: TaskStatus = await finished(info, "in-flight")
        finally:
            for gateway_ in [held, *others]:
                await gateway_.close()
        assert status_.state == "completed"
        assert [r.metadata["polar_attempt"] for r in status_.results] == [attempt]
        sent = [a for batch in [*held.batches, *(b for o in others for b in o.batches)] for _, a, _ in batch]
        assert sent == [1, attempt]  # the held batch, then the send that ran it

    try:
        asyncio.run(body())
    finally:
        server.stop()


class BusyGateway(PickyGateway):
    """A gateway that takes everything, but answers no batch until ``release`` (a node slow to answer)."""

    def __init__(self, server: dict[str, Any]) -> None:
        super().__init__(server)
        self.refused = {0, 1, 2, 3}  # nothing refused
        self.release = asyncio.Event()

    async def _batch(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return await super()._batch(request)


def test_sessions_chosen_while_a_node_is_busy_with_calls_go_together_in_its_next_call(tmp_path: Path) -> None:
    """A node with its calls under way (``SENDS_PER_NODE``) gets the sessions chosen meanwhile in one next call, not
    one call per dispatch round: at 100,000 sessions in flight, most of a burst's cost was calls of one or two."""
    config = serve_config(tmp_path, "s", server={"reservations_per_node": 64, "max_queued_per_node": 64})
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    tasks = 8

    async def body() -> None:
        info = await server.ready()
        busy = BusyGateway(info)
        await busy.start()
        try:
            async with client(info) as http:
                for i in range(tasks):  # one dispatch round each: the task's sessions are sent before the next
                    await http.post("/rollout/task/submit", json=waiting_task(f"t{i}", 2))

                    async def sent(task_id: str = f"t{i}") -> bool:
                        status = TaskStatus.model_validate((await http.get(f"/rollout/task/{task_id}")).json())
                        return "pending" not in status.sessions.values()

                    await until_true(sent, f"task t{i} dispatched")
                assert busy.batches == []  # nothing answered yet: two calls wait on the node, the rest is queued
                busy.release.set()
                done = [await finished(info, f"t{i}") for i in range(tasks)]
        finally:
            await busy.close()
        assert all(status.state == "completed" and status.completed == 2 for status in done)
        assert [len(batch) for batch in busy.batches] == [2, 2, 2 * (tasks - 2)]
        assert all(attempt == 1 for batch in busy.batches for _, attempt, _ in batch)  # each sent once

    try:
        asyncio.run(body())
    finally:
        server.stop()
