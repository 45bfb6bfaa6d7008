"""The inference pool over real HTTP replicas (small aiohttp servers in vLLM's answer shape: a real vLLM is too
heavy to start four of; tests/server/test_inference_pool_vllm.py does the same with two real ones): routing with
session affinity and group affinity, failover and re-admission, pause and resume with versions, drain, weight
loads."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from polar_cli.errors import BackendError, ConfigError, PauseTimeout, PoolControlError
from polar_cli.interfaces.backend import BackendClient
from polar_cli.metrics import ProxyMetrics
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.pool import InferencePool, PoolConfig, rank_replicas
from polar_cli.proxy.retry import RetryConfig
from polar_cli.proxy.sessions import affinity_group
from polar_cli.registry import get_backend

from .upstream import vllm_answer, vllm_chunks

FAST = PoolConfig(health_interval_s=0.05, health_timeout_s=1.0)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Replica:
    """One fake inference server: answers like vLLM; ``hold`` keeps calls in flight until it is set."""

    def __init__(self, *, token_ids: bool = True) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.calls = 0
        self.sessions: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.arrived = asyncio.Event()
        self.token_ids = token_ids
        self._runner: web.AppRunner | None = None

    async def start(self) -> Replica:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls += 1
        self.arrived.set()
        text = body["messages"][-1]["content"]
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for n, chunk in enumerate(vllm_chunks(text)):
                if n == 2:
                    await self.hold.wait()
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        await self.hold.wait()
        answer = vllm_answer(text)
        if not self.token_ids:
            answer.pop("prompt_token_ids")
        return web.json_response(answer)


def vllm(url: str | None) -> BackendClient:
    return get_backend("vllm").client(url=url, model="served-model", retry=RetryConfig(attempts=1))


def chat(text: str = "hi", *, stream: bool = False) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": text}], stream=stream)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


async def replicas(n: int, **options: Any) -> list[Replica]:
    return [await Replica(**options).start() for _ in range(n)]


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


def test_sessions_spread_over_replicas_and_stay_on_theirs() -> None:
    async def test() -> None:
        a, b = await replicas(2)
        pool = InferencePool(vllm, [a.url, b.url], config=FAST)
        try:
            first = {s: (await pool.generate(chat(), session_id=s)).replica for s in ("s1", "s2", "s3", "s4")}
            assert set(first.values()) == {a.url, b.url}
            for _ in range(3):
                for session, replica in first.items():
                    generation = await pool.generate(chat(), session_id=session)
                    assert generation.replica == replica and generation.policy_version == 1
            assert a.calls == b.calls == 8
            status = pool.status()
            assert [r.sessions for r in status.replicas] == [2, 2] and status.in_flight == 0
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


def test_sessions_that_arrive_one_at_a_time_still_spread() -> None:
    """Each session ends before the next starts (a loaded machine, short sessions): the replicas tie on calls in
    flight and sessions held, and the tie goes to the one left unchosen longest, not always to the first."""

    async def test() -> None:
        a, b = await replicas(2)
        pool = InferencePool(vllm, [a.url, b.url], config=FAST)
        try:
            used = []
            for session in ("s1", "s2", "s3", "s4"):
                used.append((await pool.generate(chat(), session_id=session)).replica)
                await pool.close_session(session)
            assert used == [a.url, b.url, a.url, b.url]
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


def home(group: str, urls: list[str]) -> str:
    """The replica ``group``'s sessions prefer."""
    return rank_replicas(group, urls, key=str)[0]


def groups_homed(urls: list[str]) -> tuple[str, str]:
    """Two group names whose sessions prefer different replicas of ``urls``."""
    names = [f"task-{i}" for i in range(64)]
    first = names[0]
    return first, next(n for n in names if home(n, urls) != home(first, urls))


def test_rendezvous_ranking_is_stable_and_moves_only_the_groups_of_a_replica_that_leaves() -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    groups = [f"task-{i}" for i in range(200)]
    ranked = {g: rank_replicas(g, urls, key=str) for g in groups}
    assert all(rank_replicas(g, list(reversed(urls)), key=str) == ranked[g] for g in groups)  # order-free
    assert all(sum(ranked[g][0] == u for g in groups) > 25 for u in urls)  # every replica is some groups' first
    left = urls[1:]
    for group in groups:  # without urls[0]: each group keeps its order of the others
        assert rank_replicas(group, left, key=str) == [u for u in ranked[group] if u != urls[0]]


def test_a_sessions_group_is_its_tasks_group_id_else_its_task_id() -> None:
    assert affinity_group({"task_id": "t1", "group_id": "prompt-7"}) == "prompt-7"
    assert affinity_group({"task_id": "t1", "group_id": 7}) == "7"
    assert affinity_group({"task_id": "t1", "sample_index": 3}) == "t1"
    assert affinity_group({"sample_index": 3}) is None


def test_a_groups_sessions_go_to_its_replica_and_other_groups_to_theirs() -> None:
    """Sessions of one group arrive one at a time (each ends before the next): without a group they would alternate
    (the test above); with one they all land on the group's replica, and a second group's on its own."""

    async def test() -> None:
        a, b = await replicas(2)
        pool = InferencePool(vllm, [a.url, b.url], config=FAST)
        try:
            for group in groups_homed([a.url, b.url]):
                used = set()
                for i in range(4):
                    await pool.open_session(f"{group}-{i}", {}, group=group)
                    used.add((await pool.generate(chat(), session_id=f"{group}-{i}")).replica)
                    await pool.close_session(f"{group}-{i}")
                assert used == {home(group, [a.url, b.url])}
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


async def held_sessions(pool: InferencePool, group: str, count: int) -> list[asyncio.Task[Generation]]:
    """``count`` sessions of ``group``, each placed while the ones before it still have their call in flight."""
    calls = []
    for i in range(count):
        await pool.open_session(f"{group}-{i}", {}, group=group)
        calls.append(asyncio.create_task(pool.generate(chat(), session_id=f"{group}-{i}")))
        await until(lambda n=i + 1: pool.in_flight() == n)
    return calls


@pytest.mark.parametrize("margin", [0, 2])
def test_a_group_spills_over_once_its_replica_is_busier_than_the_margin(margin: int) -> None:
    """With ``margin`` calls more in flight on the group's replica than on the other, the next session still goes
    there; one more and it spills over to the other replica (and stays there)."""

    async def test() -> None:
        a, b = await replicas(2)
        a.hold.clear()
        b.hold.clear()
        pool = InferencePool(vllm, [a.url, b.url], config=FAST.model_copy(update={"affinity_margin": margin}))
        pool.metrics = metrics = ProxyMetrics()
        try:
            group = "task-0"
            preferred = home(group, [a.url, b.url])
            other = b.url if preferred == a.url else a.url
            calls = await held_sessions(pool, group, margin + 2)
            in_flight = {r.url: r.in_flight for r in pool.status().replicas}
            assert in_flight == {preferred: margin + 1, other: 1}
            a.hold.set()
            b.hold.set()
            placed = [(await call).replica for call in calls]
            assert placed == [preferred] * (margin + 1) + [other]
            assert (await pool.generate(chat(), session_id=f"{group}-{margin + 1}")).replica == other
            placements = {p: metrics.registry.get_sample_value("polar_inference_group_placements_total", {"placed": p})
                          for p in ("first", "spilled")}  # fmt: skip
            assert placements == {"first": margin + 1, "spilled": 1}
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


def test_with_group_affinity_off_a_groups_sessions_spread() -> None:
    async def test() -> None:
        a, b = await replicas(2)
        a.hold.clear()
        b.hold.clear()
        pool = InferencePool(vllm, [a.url, b.url], config=FAST.model_copy(update={"group_affinity": False}))
        try:
            calls = await held_sessions(pool, "task-0", 4)
            a.hold.set()
            b.hold.set()
            placed = [(await call).replica for call in calls]
            assert placed == [a.url, b.url, a.url, b.url]
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


def test_a_group_whose_replica_is_out_of_rotation_goes_to_its_next_one() -> None:
    async def test() -> None:
        reps = await replicas(3)
        urls = [r.url for r in reps]
        group = "task-0"
        first, second, _ = rank_replicas(group, urls, key=str)
        pool = InferencePool(vllm, urls, config=FAST, retry=RetryConfig(attempts=3, base_delay_s=0.01))
        try:
            await next(r for r in reps if r.url == first).stop()
            placed = set()
            for i in range(3):
                await pool.open_session(f"s{i}", {}, group=group)
                placed.add((await pool.generate(chat(), session_id=f"s{i}")).replica)
            assert placed == {second}  # the first session failed over to it; the others came straight to it
        finally:
            await pool.close()
            for replica in reps:
                await replica.stop()

    run(test)


def test_a_dead_replica_is_left_and_readmitted_when_it_answers() -> None:
    async def test() -> None:
        a, b = await replicas(2)
        pool = InferencePool(vllm, [a.url, b.url], config=FAST, retry=RetryConfig(attempts=3, base_delay_s=0.01))
        try:
            sessions = [f"s{i}" for i in range(4)]
            for s in sessions:
                await pool.generate(chat(), session_id=s)
            await a.stop()  # connection refused from now on
            for s in sessions:  # every session goes on, on b: the caller sees no error
                assert (await pool.generate(chat(), session_id=s)).replica == b.url
            dead = pool.status().replicas[0]
            assert dead.state == "unhealthy" and dead.errors >= 1 and "unreachable" in (dead.last_error or "")
            await a.start()  # same port: the health check takes it back
            await until(lambda: pool.status().replicas[0].state == "healthy")
            answered = {(await pool.generate(chat(), session_id=f"new{i}")).replica for i in range(4)}
            assert a.url in answered
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


def test_a_pause_waits_for_calls_in_flight_and_holds_new_ones_until_resume() -> None:
    async def test() -> None:
        (a,) = await replicas(1)
        pool = InferencePool(vllm, [a.url], config=FAST)
        try:
            a.hold.clear()
            flying = asyncio.create_task(pool.generate(chat(), session_id="s1"))
            await a.arrived.wait()
            pausing = asyncio.create_task(pool.pause("wait", timeout_s=10))
            await asyncio.sleep(0.1)
            assert not pausing.done()  # the call in flight keeps the pool busy
            waiting = asyncio.create_task(pool.generate(chat(), session_id="s2"))
            await until(lambda: pool.status().waiting == 1)
            a.hold.set()
            status = await pausing
            assert status.paused == "wait" and status.in_flight == 0 and status.waiting == 1
            assert (await flying).policy_version == 1
            await asyncio.sleep(0.1)
            assert a.calls == 1 and not waiting.done()  # held at the proxy, never sent
            status = await pool.resume(policy_version=2)
            assert status.paused is None and status.policy_version == 2
            generation = await waiting
            assert generation.policy_version == 2 and generation.version_spans is None and a.calls == 2
        finally:
            await pool.close()
            await a.stop()

    run(test)


def test_a_pause_that_times_out_names_what_it_waited_for_and_stays_paused() -> None:
    async def test() -> None:
        (a,) = await replicas(1)
        pool = InferencePool(vllm, [a.url], config=FAST)
        try:
            a.hold.clear()
            flying = asyncio.create_task(pool.generate(chat(), session_id="slow-session"))
            await a.arrived.wait()
            with pytest.raises(PauseTimeout, match=r"1 call\(s\) on http://127.0.0.1:\d+ \(sessions slow-session\)"):
                await pool.pause("wait", timeout_s=0.2)
            assert pool.status().paused == "wait"
            a.hold.set()
            await flying
            await pool.resume()
            assert pool.policy_version == 2
        finally:
            await pool.close()
            await a.stop()

    run(test)


def test_a_stream_across_a_version_change_records_exact_spans() -> None:
    async def test() -> None:
        (a,) = await replicas(1)
        pool = InferencePool(vllm, [a.url], config=FAST)
        try:
            a.hold.clear()  # the replica stops after two chunks (the first holds only the prompt's ids)
            stream = await pool.open_stream(chat("abcd", stream=True), session_id="s1")
            chunks: list[dict[str, Any]] = []

            async def read() -> None:
                async for chunk in stream.chunks():
                    chunks.append(chunk)

            reading = asyncio.create_task(read())
            await until(lambda: len(chunks) == 2)
            await pool.pause("keep", timeout_s=5)  # a fake without /pause: its call runs on, counted as crossing
            await pool.resume(policy_version=7)
            a.hold.set()
            await reading
            generation = Generation(id="x", model="m", message={"role": "assistant", "content": ""},
                                    finish_reason="stop", prompt_ids=[], response_ids=[7, 8, 2])  # fmt: skip
            stream.stamp(generation)  # type: ignore[attr-defined]
            assert generation.policy_version == 1 and generation.replica == a.url
            spans = [(s.start, s.version) for s in generation.version_spans or []]
            assert spans == [(0, 1), (1, 7)]  # one token relayed before the update, the rest after
            assert pool.status().in_flight == 0
        finally:
            await pool.close()
            await a.stop()

    run(test)


def test_remove_drains_then_drops_and_add_takes_load() -> None:
    async def test() -> None:
        a, b = await replicas(2)
        pool = InferencePool(vllm, [a.url], config=FAST)
        try:
            with pytest.raises(ConfigError, match="last replica"):
                await pool.remove(a.url)
            with pytest.raises(ConfigError, match="not in the pool"):
                await pool.remove(b.url)
            status = await pool.add(b.url + "/v1/")
            assert [r.url for r in status.replicas] == [a.url, b.url]
            assert (await pool.add(b.url)).replicas == status.replicas  # adding twice is adding once
            a.hold.clear()
            flying = asyncio.create_task(pool.generate(chat(), session_id="s1"))
            await a.arrived.wait()
            removing = asyncio.create_task(pool.remove(a.url, timeout_s=10))
            await until(lambda: pool.status().replicas[0].state == "draining")
            assert (await pool.generate(chat(), session_id="s1")).replica == b.url  # no new call goes to a
            assert not removing.done()
            a.hold.set()
            assert (await flying).replica == a.url
            status = await removing
            assert [r.url for r in status.replicas] == [b.url]
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    run(test)


def test_a_replica_answering_without_token_ids_fails_the_call_naming_it() -> None:
    async def test() -> None:
        (a,) = await replicas(1, token_ids=False)
        pool = InferencePool(vllm, [a.url], config=FAST)
        try:
            with pytest.raises(BackendError, match="no token ids") as info:
                await pool.generate(chat(), session_id="s1")
            assert a.url in str(info.value)
            assert pool.status().replicas[0].state == "healthy"  # it answers: not a dead replica
        finally:
            await pool.close()
            await a.stop()

    run(test)


class Weights(BackendClient):
    """A backend whose 'weights' are a path: reload_weights records it (what vLLM and SGLang do is tested on the real
    vLLM in tests/proxy/test_vllm_weights.py)."""

    name = "weights"
    reloads_weights = True

    def __init__(self, url: str | None, fail: bool = False) -> None:
        self.url, self.fail = url, fail
        self.loaded: list[str] = []

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        return Generation(id="g", model="m", message={"role": "assistant", "content": "x"}, finish_reason="stop",
                          prompt_ids=[1], response_ids=[2])  # fmt: skip

    async def count_tokens(self, request: ChatRequest) -> int:
        return 1

    async def reload_weights(self, path: str, timeout_s: float) -> None:
        if self.fail:
            raise BackendError("disk full")
        self.loaded.append(path)


def test_load_weights_reloads_each_replica_and_resumes_under_the_new_version() -> None:
    async def test() -> None:
        made: dict[str | None, Weights] = {}

        def make(url: str | None) -> BackendClient:
            made[url] = Weights(url, fail=url == "http://bad:1")
            return made[url]

        pool = InferencePool(make, ["http://a:1", "http://b:1"], config=FAST)
        status = await pool.load_weights("/ckpt/step-10", policy_version=10)
        assert status.policy_version == 10 and status.paused is None
        assert made["http://a:1"].loaded == made["http://b:1"].loaded == ["/ckpt/step-10"]
        await pool.load_weights("/ckpt/step-11", urls=["http://b:1"])
        assert made["http://a:1"].loaded == ["/ckpt/step-10"] and pool.policy_version == 11
        pool._replicas.append(pool._new_replica("http://bad:1"))
        with pytest.raises(BackendError, match=r"failed on 1 of 3 replica\(s\): http://bad:1: disk full"):
            await pool.load_weights("/ckpt/step-12")
        assert pool.status().paused == "wait" and pool.policy_version == 11
        assert (await pool.resume()).policy_version == 12
        assert (await pool.generate(chat(), session_id="s")).policy_version == 12
        await pool.pause("wait")  # paused by its caller: the reload leaves resuming to it
        status = await pool.load_weights("/ckpt/step-13", policy_version=13, urls=["http://a:1"])
        assert status.paused == "wait" and status.policy_version == 12
        assert made["http://a:1"].loaded[-1] == "/ckpt/step-13"
        assert (await pool.resume(13)).policy_version == 13

    run(test)


def test_load_weights_on_a_replica_that_cannot_reload_is_refused_before_the_pause() -> None:
    """Was a 502 after the pause, leaving the pool paused (every session on the node then waited)."""

    async def test() -> None:
        class Fixed(Weights):
            reloads_weights = False

        pool = InferencePool(lambda url: Fixed(url) if url == "http://fixed:1" else Weights(url),
                             ["http://a:1", "http://fixed:1"], config=FAST)  # fmt: skip
        with pytest.raises(PoolControlError, match=r"the weights backend cannot reload .*nothing was paused"):
            await pool.load_weights("/ckpt/step-2")
        assert pool.status().paused is None and pool.policy_version == 1
        status = await pool.load_weights("/ckpt/step-2", urls=["http://a:1"])  # the ones that can, asked alone
        assert status.paused is None and status.policy_version == 2

    run(test)


def test_sync_takes_on_the_servers_version_and_pause() -> None:
    async def test() -> None:
        pool = InferencePool.of(Weights(None))
        await pool.sync(5, "wait")
        waiting = asyncio.create_task(pool.generate(chat(), session_id="s"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and pool.status().waiting == 1
        await pool.sync(6, None)
        assert (await waiting).policy_version == 6
        with pytest.raises(ConfigError, match="takes no replicas"):
            await pool.add("http://other:1")

    run(test)
