"""The server's ``/inference`` routes: a real ``polar serve --role server`` fans each change out to its gateways.

The gateways here are small aiohttp apps speaking the node side of the control routes (docs/service.md, "Weight
updates"), each with a pool of made-up replicas: what is checked is the server's part (concurrency, which gateway is
told what, in which order, what it keeps across a restart, how a failing gateway is reported). The real gateway's
routes are exercised end to end in ``tests/client/test_inference.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from polar_cli.client import AsyncPolarClient
from polar_cli.errors import AuthError, ConfigError, PoolControlError
from polar_cli.models import InferenceStatus
from polar_cli.models.inference import PoolStatus, ReplicaStatus
from polar_cli.node_protocol import BackendBody, CancelStaleBody, LoadWeightsBody, PauseBody, ResumeBody
from tests.server.procs import Serve, free_port, serve_config, until_true

Event = tuple[float, str, str]
"""(monotonic time, node name, what it was told)"""


class PoolGateway:
    """A registered node whose control routes act on a pretend pool: ``pause_s`` is how long its pause takes (the
    longest call in flight), ``refuse`` maps a route to the (status, message) it answers instead."""

    def __init__(self, server: dict[str, Any], name: str, replicas: list[str], events: list[Event]) -> None:
        self.server, self.name, self.events = server, name, events
        self.token = secrets.token_urlsafe(16)
        self.pool = PoolStatus(policy_version=0, replicas=[ReplicaStatus(url=u, state="healthy") for u in replicas])
        self.pause_s = 0.0
        self.refuse: dict[str, tuple[int, str]] = {}
        self.bodies: dict[str, list[Any]] = {}
        self.registered: dict[str, Any] = {}
        self.node_id = ""
        self.runner: web.AppRunner | None = None
        self.work: set[asyncio.Task[Any]] = set()
        self.http = httpx.AsyncClient(base_url=server["url"], timeout=30)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/inference", self._status)
        app.router.add_post("/inference/pause", self._control("pause", PauseBody, self._pause))
        app.router.add_post("/inference/resume", self._control("resume", ResumeBody, self._resume))
        app.router.add_post("/inference/load_weights", self._control("load_weights", LoadWeightsBody, self._load))
        app.router.add_post("/inference/backends", self._control("add", BackendBody, self._add))
        app.router.add_delete("/inference/backends", self._control("remove", BackendBody, self._remove))
        app.router.add_post("/inference/cancel_stale", self._control("cancel_stale", CancelStaleBody, self._stale))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        await self.register()

    async def register(self) -> None:
        assert self.runner is not None
        url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        body = {"url": url, "token": self.token, "capacity": {"run_slots": 2}, "held_results": []}
        if self.node_id:
            body["node_id"] = self.node_id
        answer = await self.http.post("/nodes/register", json=body, headers=self._auth(self.server["token"]))
        answer.raise_for_status()
        self.registered = answer.json()
        self.node_id = self.registered["node_id"]
        self.pool.policy_version, self.pool.paused = self.registered["policy_version"], self.registered["paused"]
        if not self.work:
            self._spawn(self._heartbeats(float(self.registered["heartbeat_interval_s"])))

    def _auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.work.add(task)
        task.add_done_callback(self.work.discard)

    async def _heartbeats(self, interval: float) -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                await self.http.post(f"/nodes/{self.node_id}/heartbeat", json={}, headers=self._auth(self.token))
            await asyncio.sleep(interval)

    def _answer(self) -> web.Response:
        return web.json_response(self.pool.model_dump(mode="json"))

    async def _status(self, request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {self.token}"
        return self._answer()

    def _control(self, what: str, model: Any, act: Callable[[Any], Awaitable[web.Response]]) -> Any:
        async def handle(request: web.Request) -> web.Response:
            assert request.headers["Authorization"] == f"Bearer {self.token}"
            body = model.model_validate_json(await request.read())
            self.bodies.setdefault(what, []).append(body)
            self.events.append((time.monotonic(), self.name, what))
            if what in self.refuse:
                status, message = self.refuse[what]
                return web.json_response({"error": {"message": message, "type": "conflict"}}, status=status)
            return await act(body)

        return handle

    async def _pause(self, body: PauseBody) -> web.Response:
        self.pool.paused = body.mode
        await asyncio.sleep(self.pause_s)
        self.events.append((time.monotonic(), self.name, "quiet"))
        return self._answer()

    async def _resume(self, body: ResumeBody) -> web.Response:
        assert body.policy_version is not None  # the server always says which
        self.pool.policy_version, self.pool.paused = body.policy_version, None
        return self._answer()

    async def _load(self, body: LoadWeightsBody) -> web.Response:
        await asyncio.sleep(0.05)
        self.events.append((time.monotonic(), self.name, "loaded"))
        return self._answer()

    async def _add(self, body: BackendBody) -> web.Response:
        self.pool.replicas.append(ReplicaStatus(url=body.url, state="healthy"))
        return self._answer()

    async def _remove(self, body: BackendBody) -> web.Response:
        self.pool.replicas = [r for r in self.pool.replicas if r.url != body.url]
        return self._answer()

    async def _stale(self, body: CancelStaleBody) -> web.Response:
        return web.json_response({"cancelled": [f"{self.name}-old-{body.older_than}"]})

    async def close(self) -> None:
        for task in list(self.work):
            task.cancel()
        await asyncio.gather(*self.work, return_exceptions=True)
        await self.http.aclose()
        if self.runner is not None:
            await self.runner.cleanup()


Body = Callable[[dict[str, Any], list[PoolGateway], list[Event]], Awaitable[None]]


def run_with_gateways(tmp_path: Path, replicas: list[list[str]], body: Body) -> None:
    """A real server and one PoolGateway per entry of ``replicas`` (named gw0, gw1, ...), registered in order."""
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(serve_config(tmp_path, "s")))

    async def main() -> None:
        info = await server.ready()
        events: list[Event] = []
        gateways = [PoolGateway(info, f"gw{i}", urls, events) for i, urls in enumerate(replicas)]
        try:
            for gateway in gateways:
                await gateway.start()
            await body(info, gateways, events)
        finally:
            await asyncio.gather(*(gateway.close() for gateway in gateways))

    try:
        asyncio.run(main())
    finally:
        server.stop()


def server_http(info: dict[str, Any]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=info["url"], headers={"Authorization": f"Bearer {info['token']}"}, timeout=30)


def polar(info: dict[str, Any], timeout: float = 30.0) -> AsyncPolarClient:
    return AsyncPolarClient(info["url"], info["token"], timeout=timeout)


def test_a_pause_over_eight_gateways_takes_as_long_as_the_slowest(tmp_path: Path) -> None:
    async def body(info: dict[str, Any], gateways: list[PoolGateway], events: list[Event]) -> None:
        for gateway in gateways:
            gateway.pause_s = 1.0
        gateways[5].pause_s = 2.0  # its longest call in flight
        async with polar(info) as client:
            assert len((await client.inference()).gateways) == 8  # (the connections are open: only the pause counts)
            start = time.monotonic()
            status = await client.pause("keep", timeout=20)
            elapsed = time.monotonic() - start
        assert status.paused == "keep" and status.policy_version == 1
        assert [g.pool.paused for g in status.gateways if g.pool] == ["keep"] * 8
        assert [g.bodies["pause"] for g in gateways] == [[PauseBody(mode="keep", timeout_s=20)]] * 8
        order = [what for _, _, what in sorted(events) if what in ("pause", "quiet")]
        assert order == ["pause"] * 8 + ["quiet"] * 8, order  # every gateway was told before any answered
        # it waits for the slowest (2 s); one after the other would take 9 s
        assert 2.0 <= elapsed < 9.0, f"the pause took {elapsed:.3f}s"

    run_with_gateways(tmp_path, [[f"http://replica-{i}"] for i in range(8)], body)


def test_resume_sets_the_version_it_never_goes_back_and_a_restart_keeps_it(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "s", server={"initial_policy_version": 7})
    argv = ["--role", "server", "--port", str(free_port()), "--config", str(config)]
    servers = [Serve(tmp_path / "server", *argv)]

    async def main() -> None:
        info = await servers[0].ready()
        events: list[Event] = []
        gateway = PoolGateway(info, "gw0", ["http://replica-0"], events)
        await gateway.start()
        try:
            assert (gateway.registered["policy_version"], gateway.registered["paused"]) == (7, None)
            async with polar(info) as client:
                assert (await client.inference()).policy_version == 7
                paused = await client.pause()
                assert paused.paused == "wait" and gateway.pool.paused == "wait"
                resumed = await client.resume()
                assert (resumed.policy_version, resumed.paused) == (8, None)
                assert gateway.bodies["resume"] == [ResumeBody(policy_version=8)]
                assert (await client.resume(12)).policy_version == 12
                assert (await client.resume(12)).policy_version == 12  # the same again: allowed (a retry)
                with pytest.raises(PoolControlError, match=r"policy_version 11 is older than the current 12"):
                    await client.resume(11)
                assert gateway.pool.policy_version == 12
                await client.pause("keep")

            servers[0].stop()  # on the same data dir and port: the gateway goes on heartbeating to it
            servers.append(Serve(tmp_path / "server", *argv))
            info = await servers[1].ready()
            later = PoolGateway(info, "gw1", [], events)
            await later.start()
            try:
                assert (later.registered["policy_version"], later.registered["paused"]) == (12, "keep")
                async with polar(info) as client:
                    status = await client.inference()
                    assert (status.policy_version, status.paused) == (12, "keep")
                    assert len(status.gateways) == 2
                    assert (await client.resume()).policy_version == 13
                assert gateway.bodies["resume"][-1] == later.bodies["resume"][-1] == ResumeBody(policy_version=13)
            finally:
                await later.close()
        finally:
            await gateway.close()

    try:
        asyncio.run(main())
    finally:
        for server in servers:
            server.stop()


def test_load_weights_reloads_each_replica_once_between_one_pause_and_one_resume(tmp_path: Path) -> None:
    shared = [["http://r1", "http://r2"], ["http://r2/", "http://r3"], ["http://r3"]]

    async def body(info: dict[str, Any], gateways: list[PoolGateway], events: list[Event]) -> None:
        async with polar(info) as client:
            status = await client.load_weights("/ckpt/step-10", timeout=30)
            assert (status.policy_version, status.paused) == (2, None)
            assert {g.pool.policy_version for g in status.gateways if g.pool} == {2}
            loads = {g.name: g.bodies.get("load_weights", []) for g in gateways}
            assert loads == {
                "gw0": [LoadWeightsBody(path="/ckpt/step-10", policy_version=2, timeout_s=30,
                                        urls=["http://r1", "http://r2"])],
                "gw1": [LoadWeightsBody(path="/ckpt/step-10", policy_version=2, timeout_s=30, urls=["http://r3"])],
                # its one replica is gw1's too, and reloaded once; it is told all the same (urls=[]), so that it
                # counts the load for its stale replicas (cross-policy sampling)
                "gw2": [LoadWeightsBody(path="/ckpt/step-10", policy_version=2, timeout_s=30, urls=[])],
            }  # fmt: skip
            order = [what for _, _, what in sorted(events)]
            assert order.index("loaded") > max(i for i, what in enumerate(order) if what == "quiet")
            assert order.index("resume") > max(i for i, what in enumerate(order) if what == "loaded")
            assert order.count("pause") == 3 and order.count("resume") == 3

            older = "policy_version 1 is older than the current 2"
            with pytest.raises(PoolControlError, match=older):
                await client.load_weights("/ckpt/old", policy_version=1)
            assert sum(len(g.bodies["pause"]) for g in gateways) == 3  # refused before anything was told
            async with httpx.AsyncClient(
                base_url=info["url"], headers={"Authorization": f"Bearer {info['token']}"}
            ) as h:
                urls = await h.post("/inference/load_weights", json={"path": "/x", "urls": ["http://r1"]})
                assert urls.status_code == 400 and "the server chooses" in urls.json()["error"]["message"]
            gateways[1].refuse["load_weights"] = (502, "loading weights from /ckpt/bad failed on 1 of 1 replica(s)")
            failed = r"load_weights from /ckpt/bad failed on 1 of 3 gateways\. Sampling stays paused under the old "
            with pytest.raises(PoolControlError, match=failed + r"version: .*: .*502"):
                await client.load_weights("/ckpt/bad")
            assert [len(g.bodies["pause"]) for g in gateways] == [3, 3, 3]  # paused, then again after the failure
            assert (await client.inference()).paused == "wait" and gateways[0].pool.paused == "wait"

            for gateway in gateways:
                gateway.pool.replicas = [ReplicaStatus(url="(in process)", state="healthy")]  # scripted pools
            await client.resume()
            with pytest.raises(PoolControlError, match="no gateway lists an inference server to reload from /ckpt/x"):
                await client.load_weights("/ckpt/x")
            assert (await client.inference()).paused is None  # nothing was paused
            assert [len(g.bodies["pause"]) for g in gateways] == [3, 3, 3]

    run_with_gateways(tmp_path, shared, body)


def test_a_gateway_that_fails_is_named_with_what_it_said(tmp_path: Path) -> None:
    async def body(info: dict[str, Any], gateways: list[PoolGateway], events: list[Event]) -> None:
        gateways[1].refuse["pause"] = (409, "waited 1s for 2 calls in flight on http://r1")
        async with polar(info) as client:
            with pytest.raises(PoolControlError) as failed:
                await client.pause(timeout=1)
            message = str(failed.value)
            assert "pause failed on 1 of 3 gateways. Sampling stays paused on every gateway that paused" in message
            assert f"or resume: {gateways[1].node_id} (" in message
            assert "answered 409: waited 1s for 2 calls in flight on http://r1" in message and "(HTTP 409" in message
            assert gateways[0].pool.paused == "wait"  # the others did pause, and stay so
            assert (await client.inference()).paused == "wait"

            gateways[2].refuse["add"] = (400, "a scripted pool has no replicas to add to")
            with pytest.raises(ConfigError, match="a scripted pool has no replicas"):
                await client.add_backend("http://r9")  # every failure a refusal of the input: a 400

            assert gateways[2].runner is not None
            await gateways[2].runner.cleanup()  # it stops answering, still heartbeating
            with pytest.raises(PoolControlError, match=f"{gateways[2].node_id} .* did not answer"):
                await client.resume()
            status = await client.inference()  # the status never fails: it says what each answered
            by_node = {g.node_id: g for g in status.gateways}
            assert by_node[gateways[0].node_id].pool is not None
            down = by_node[gateways[2].node_id]
            assert down.pool is None and down.error is not None and "did not answer" in down.error

    run_with_gateways(tmp_path, [["http://r1"], ["http://r2"], []], body)


def test_backends_and_cancel_stale_go_to_the_gateways_they_concern(tmp_path: Path) -> None:
    async def body(info: dict[str, Any], gateways: list[PoolGateway], events: list[Event]) -> None:
        async with polar(info) as client:
            added = await client.add_backend("http://r1/")
            assert [len(g.bodies.get("add", [])) for g in gateways] == [0, 1]  # gw0 has it already
            assert all(any(r.url.rstrip("/") == "http://r1" for r in g.pool.replicas) for g in added.gateways if g.pool)
            removed = await client.remove_backend("http://r2", timeout=5)
            assert [g.bodies.get("remove", []) for g in gateways] == [[], [BackendBody(url="http://r2", timeout_s=5)]]
            assert isinstance(removed, InferenceStatus)
            with pytest.raises(ConfigError, match="no gateway has replica http://nowhere"):
                await client.remove_backend("http://nowhere")

            stale = await client.cancel_stale()
            assert stale.cancelled == ["gw0-old-1", "gw1-old-1"]  # default: the current version, told to each
            assert (await client.cancel_stale(older_than=5)).cancelled == ["gw0-old-5", "gw1-old-5"]

    run_with_gateways(tmp_path, [["http://r1"], ["http://r2"]], body)


def test_the_inference_routes_need_the_token_and_refuse_bad_bodies(tmp_path: Path) -> None:
    async def body(info: dict[str, Any], gateways: list[PoolGateway], events: list[Event]) -> None:
        routes = [("GET", "/inference"), ("POST", "/inference/pause"), ("POST", "/inference/resume"),
                  ("POST", "/inference/load_weights"), ("POST", "/inference/backends"),
                  ("DELETE", "/inference/backends"), ("POST", "/inference/cancel_stale")]  # fmt: skip
        async with httpx.AsyncClient(base_url=info["url"], timeout=30) as http:
            for method, route in routes:
                answer = await http.request(method, route, json={"url": "http://r9", "path": "/p"})
                assert answer.status_code == 401, (method, route)
            assert gateways[0].bodies == {}  # nothing reached a gateway
            auth = {"Authorization": f"Bearer {info['token']}"}
            bad = [
                ("/inference/pause", {"mode": "later"}, "mode"),
                ("/inference/pause", {"timeout_s": 0}, "timeout_s"),
                ("/inference/pause", {"mode": "wait", "extra": 1}, "unknown field 'extra'"),
                ("/inference/resume", {"policy_version": "two"}, "policy_version"),
                ("/inference/resume", {"policy_version": 10**30}, "policy_version"),  # past what JSON holds exactly
                ("/inference/resume", {"policy_version": -1}, "policy_version"),
                ("/inference/pause", {"timeout_s": 1e12}, "timeout_s"),
                ("/inference/cancel_stale", {"older_than": 2**64}, "older_than"),
                ("/inference/load_weights", {}, "path"),
                ("/inference/backends", {"timeout_s": 3}, "url"),
                ("/inference/cancel_stale", [1], "CancelStaleBody"),
            ]
            for route, sent, named in bad:
                answer = await http.post(route, json=sent, headers=auth)
                assert answer.status_code == 400, (route, sent, answer.text)
                assert named in answer.json()["error"]["message"], (route, answer.text)
            broken = await http.post("/inference/pause", content=b"{", headers=auth)
            assert broken.status_code == 400
            assert gateways[0].bodies == {}
            empty = await http.post("/inference/pause", headers=auth)  # no body: the defaults
            assert empty.status_code == 200 and empty.json()["paused"] == "wait"
        async with AsyncPolarClient(info["url"], "wrong") as client:
            with pytest.raises(AuthError):
                await client.inference()

    run_with_gateways(tmp_path, [["http://r1"]], body)


def test_a_gateway_declared_dead_is_left_out(tmp_path: Path) -> None:
    async def body(info: dict[str, Any], gateways: list[PoolGateway], events: list[Event]) -> None:
        for task in list(gateways[1].work):
            task.cancel()  # its heartbeats stop

        async def only_one() -> bool:
            async with polar(info) as client:
                return len((await client.inference()).gateways) == 1

        await until_true(only_one, "the silent gateway declared dead", within=30)
        async with polar(info) as client:
            assert len((await client.pause()).gateways) == 1
            assert "pause" not in gateways[1].bodies

    run_with_gateways(tmp_path, [["http://r1"], ["http://r2"]], body)
