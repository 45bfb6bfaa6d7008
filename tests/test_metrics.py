"""The metric definitions (``polar_cli.metrics``): names and types as Prometheus expects, one registry per component,
collectors that read live state at scrape time, the pipeline's and the proxy's seams, and the separate metrics bind.

The real-process check (``polar serve`` scraped while sessions pass the stages) is tests/server/test_metrics_serve.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import httpx
import prometheus_client
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from polar_cli.gateway import PipelineConfig, SessionJob, Stage, StagedPipeline
from polar_cli.launch import ServeConfig
from polar_cli.metrics import (
    Exposition,
    GatewayMetrics,
    PoolReading,
    ProxyMetrics,
    ReplicaReading,
    ServerMetrics,
    ServerReading,
    render_all,
)
from polar_cli.proxy import ProxyConfig, ProxyState, create_proxy_app
from polar_cli.proxy.pool import InferencePool
from polar_cli.proxy.retry import RetryConfig
from polar_cli.runtimes.pool import SandboxPool
from polar_cli.web.listen import listen
from polar_cli.web.metrics import listen_metrics
from tests.gateway.sim import SimDriver, until
from tests.proxy.test_pool import FAST, chat, replicas, vllm


def parse(text: bytes | str) -> list[Sample]:
    raw = text.decode() if isinstance(text, bytes) else text
    return [s for family in text_string_to_metric_families(raw) for s in family.samples]


def value(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def names(samples: Iterable[Sample]) -> set[str]:
    return {s.name for s in samples}


def families(text: bytes) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text.decode())}


def render(registry: prometheus_client.CollectorRegistry) -> bytes:
    return asyncio.run(Exposition(registry).render())


# ---- names, types, registries -----------------------------------------------------------------------------------


def test_every_metric_is_polar_prefixed_with_conventional_units_and_suffixes() -> None:
    proxy = ProxyMetrics()
    proxy.request("openai_chat", "generate", 200, True, 0.2)
    proxy.captured("openai_chat", "answered", 10, 3, 100)
    proxy.upstream("http://gpu-1:8000", 200, False, 0.1, retry=True)
    proxy.watch(lambda: PoolReading(3, False, 0, [ReplicaReading("http://gpu-1:8000", True, 1)]), lambda: 2)
    gateway = GatewayMetrics(proxy.registry)
    gateway.watch_sandboxes(SandboxPool().snapshot)
    server = ServerMetrics()
    server.callbacks.labels("session_result", "delivered").inc()
    server.sessions_finished.labels("completed").inc()
    text = render(proxy.registry) + render(server.registry)
    found = families(text)
    assert found and all(name.startswith("polar_") for name in found), found
    for name, kind in found.items():
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        if kind == "counter":
            assert f"{name}_total" in names(parse(text)), name  # exposed as ..._total
        assert not name.endswith("_total"), name  # the family name carries no suffix
    assert found["polar_gateway_stage_duration_seconds"] == "histogram"
    assert found["polar_inference_upstream_duration_seconds"] == "histogram"
    assert found["polar_proxy_sampled_tokens"] == "counter"
    assert found["polar_inference_policy_version"] == "gauge"
    assert found["polar_gateway_sandbox_takes"] == found["polar_gateway_sandbox_resets"] == "counter"
    assert found["polar_gateway_sandbox_pool_ready"] == "gauge"
    assert gateway.registry is proxy.registry


def test_each_component_has_its_own_registry_and_the_default_one_stays_empty_of_polar() -> None:
    first, second = ProxyMetrics(), ProxyMetrics()  # a second gateway in the same process: no "Duplicated timeseries"
    first.captured("anthropic", "answered", 5, 2, 0)
    assert value(parse(render(first.registry)), "polar_proxy_sampled_tokens_total") == 2
    assert value(parse(render(second.registry)), "polar_proxy_sampled_tokens_total") == 0
    ServerMetrics(), ServerMetrics(), GatewayMetrics(), GatewayMetrics()
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "polar_" not in default


def test_gauges_read_the_state_at_scrape_time() -> None:
    proxy = ProxyMetrics()
    replicas = [ReplicaReading("http://a:8000", True, 0), ReplicaReading("http://b:8000", False, 0)]
    pool = PoolReading(1, False, 0, replicas)
    open_sessions = [3]
    proxy.watch(lambda: pool, lambda: open_sessions[0])
    before = parse(render(proxy.registry))
    pool.policy_version, pool.paused, pool.waiting = 7, True, 4
    pool.replicas[1].healthy = True
    open_sessions[0] = 0
    after = parse(render(proxy.registry))
    assert value(before, "polar_inference_policy_version") == 1 and value(after, "polar_inference_policy_version") == 7
    assert value(before, "polar_inference_paused") == 0 and value(after, "polar_inference_paused") == 1
    assert value(after, "polar_inference_waiting_calls") == 4
    assert value(before, "polar_inference_replica_healthy", replica="http://b:8000") == 0
    assert value(after, "polar_inference_replica_healthy", replica="http://b:8000") == 1
    assert value(before, "polar_proxy_sessions") == 3 and value(after, "polar_proxy_sessions") == 0


def test_the_server_reading_is_refreshed_before_each_render() -> None:
    metrics = ServerMetrics()
    reads = []

    async def read() -> ServerReading:
        reads.append(1)
        return ServerReading(sessions={"pending": 2, "running": len(reads)}, tasks={"running": 1},
                             pending_callbacks=1, nodes=[(True, False), (True, False), (False, True)],
                             policy_version=5, paused=True)  # fmt: skip

    metrics.watch(read)
    exposition = Exposition(metrics.registry, metrics.refresh)
    first = parse(asyncio.run(exposition.render()))
    second = parse(asyncio.run(exposition.render()))
    assert value(first, "polar_server_sessions", state="running") == 1
    assert value(second, "polar_server_sessions", state="running") == 2
    assert value(second, "polar_server_nodes", healthy="true") == 2
    assert value(second, "polar_server_nodes", healthy="false", draining="true") == 1
    assert value(second, "polar_server_policy_version") == 5 and value(second, "polar_server_inference_paused") == 1
    assert value(second, "polar_server_callbacks_pending") == 1


def test_several_components_render_as_one_valid_document() -> None:
    proxy, server = ProxyMetrics(), ServerMetrics()
    GatewayMetrics(proxy.registry)
    text = asyncio.run(render_all([Exposition(server.registry), Exposition(proxy.registry)]))
    found = families(text)
    assert "polar_server_tasks_submitted" in found and "polar_proxy_requests" in found


# ---- the pipeline's seam ------------------------------------------------------------------------------------------


def test_the_pipeline_exports_queues_in_flight_outcomes_and_stage_durations() -> None:
    driver = SimDriver()
    cfg = PipelineConfig(init_workers=1, ready_capacity=1, run_slots=1, postrun_workers=1, postrun_capacity=4)
    gates = [driver.hold("evaluate", "p"), driver.hold("run", "r"), driver.hold("init", "i")]

    async def body() -> tuple[list[Sample], list[Sample]]:
        async with StagedPipeline(driver, cfg) as pipeline:
            for sid, stage in (("p", Stage.POSTRUN), ("r", Stage.RUNNING), ("q", Stage.READY), ("i", Stage.INIT)):
                job = await pipeline.submit(SessionJob(sid))
                await until(lambda job=job, stage=stage: job.stage is stage, f"{sid} in {stage}")
            await pipeline.submit(SessionJob("w"))
            exposition = Exposition(pipeline.exported.registry)
            busy = parse(await exposition.render())
            for gate in gates:
                gate.set()
            for sid in "prqiw":
                await pipeline.wait(sid)
            return busy, parse(await exposition.render())

    busy, done = asyncio.run(body())
    for stage in ("init", "running", "postrun"):
        assert value(busy, "polar_gateway_stage_in_flight", stage=stage) == 1, stage
    assert value(busy, "polar_gateway_stage_queued", stage="init") == 1
    assert value(busy, "polar_gateway_stage_queued", stage="ready") == 1
    assert value(busy, "polar_gateway_stage_capacity", stage="running") == 1
    assert value(busy, "polar_gateway_sessions_active") == 5
    assert value(busy, "polar_gateway_stage_duration_seconds_count") == 0
    assert value(done, "polar_gateway_sessions_submitted_total") == 5
    assert value(done, "polar_gateway_sessions_finished_total", status="completed") == 5
    assert value(done, "polar_gateway_sessions_active") == 0
    for stage in ("init_wait", "init", "running", "build", "evaluate", "teardown", "total"):
        assert value(done, "polar_gateway_stage_duration_seconds_count", stage=stage) == 5, stage
    assert value(done, "polar_gateway_stage_duration_seconds_bucket", stage="total", le="+Inf") == 5
    assert value(done, "polar_gateway_run_slot_busy_seconds_total") > 0
    assert not {s.labels.get("stage") for s in done} & set("prqiw")  # never a session id


# ---- the proxy's seams: a real proxy app with the scripted backend ------------------------------------------------


def test_proxy_calls_count_requests_tokens_journal_bytes_and_upstream_attempts(tmp_path: Path) -> None:
    config = ProxyConfig(backend="scripted", journal_dir=tmp_path / "journal")
    state = ProxyState(config)
    script = [{"content": "hello there"}, {"content": "again"}]

    async def body() -> list[Sample]:
        listener = await listen(create_proxy_app(config, state), "127.0.0.1", 0)
        state.base_url = listener.url
        try:
            session = await state.create_session("sess-metrics-1", backend_options={"script": script})
            base = session["base_urls"]["openai"]
            headers = {"Authorization": f"Bearer {session['api_key']}"}
            async with httpx.AsyncClient(timeout=30, headers=headers) as http:
                chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                assert (await http.post(f"{base}/chat/completions", json=chat)).status_code == 200
                answer = await http.post(f"{base}/chat/completions", json={**chat, "stream": True})
                assert answer.status_code == 200
                assert (await http.get(f"{base}/models")).status_code == 200
                refused = await http.post(f"{base}/chat/completions", json=chat, headers={"Authorization": "Bearer x"})
                assert refused.status_code == 401
            return parse(await Exposition(state.metrics.registry).render())
        finally:
            await listener.close()

    samples = asyncio.run(body())
    generate = {"provider": "openai_chat", "endpoint": "generate"}
    assert value(samples, "polar_proxy_requests_total", code="200", stream="false", **generate) == 1
    assert value(samples, "polar_proxy_requests_total", code="200", stream="true", **generate) == 1
    assert value(samples, "polar_proxy_requests_total", code="401") == 1
    assert value(samples, "polar_proxy_requests_total", endpoint="models", code="200") == 1
    assert value(samples, "polar_proxy_request_duration_seconds_count", provider="openai_chat") == 3  # the 401 too
    assert value(samples, "polar_proxy_completions_total", delivery="answered") == 2
    assert value(samples, "polar_proxy_prompt_tokens_total", provider="openai_chat") > 0
    assert value(samples, "polar_proxy_sampled_tokens_total", provider="openai_chat") > 0
    journal = (tmp_path / "journal" / "sess-metrics-1.jsonl").stat().st_size
    assert value(samples, "polar_proxy_journal_bytes_total") == journal
    assert value(samples, "polar_inference_upstream_requests_total", replica="in-process", code="200") == 2
    assert value(samples, "polar_inference_upstream_duration_seconds_count", replica="in-process") == 2
    assert value(samples, "polar_inference_retries_total") == 0
    assert value(samples, "polar_inference_policy_version") == 1
    assert value(samples, "polar_proxy_sessions") == 1
    assert all("sess-metrics-1" not in v for s in samples for v in s.labels.values())


def test_the_pool_counts_attempts_latency_and_retries_per_replica() -> None:
    async def test() -> list[Sample]:
        a, b = await replicas(2)
        pool = InferencePool(vllm, [a.url, b.url], config=FAST, retry=RetryConfig(attempts=3, base_delay_s=0.01))
        metrics = pool.metrics = ProxyMetrics()
        try:
            for session in ("s1", "s2"):
                await pool.generate(chat(), session_id=session)
            await a.stop()  # refused from now on: its session's next call fails over to b
            for session in ("s1", "s2"):
                await pool.generate(chat(), session_id=session)
            return parse(await Exposition(metrics.registry).render())
        finally:
            await pool.close()
            await a.stop()
            await b.stop()

    samples = asyncio.run(asyncio.wait_for(test(), 60))
    upstream = "polar_inference_upstream_requests_total"
    assert value(samples, upstream, replica=a_url(samples), code="200") == 1
    assert value(samples, upstream, replica=a_url(samples), code="502") == 1  # unreachable: out of rotation
    assert value(samples, "polar_inference_retries_total") == 1  # the failed-over attempt, on the other replica
    assert value(samples, upstream, code="200") == 4
    assert value(samples, "polar_inference_upstream_duration_seconds_count", stream="false") == 5


def a_url(samples: list[Sample]) -> str:
    """The replica that failed (the one with a non-200 attempt)."""
    return next(s.labels["replica"] for s in samples if s.labels.get("code") not in (None, "200"))


# ---- the separate metrics bind ------------------------------------------------------------------------------------


def test_the_metrics_bind_needs_no_token_and_is_off_unless_a_port_is_given() -> None:
    assert ServeConfig().metrics.port is None and ServeConfig().metrics.host == "127.0.0.1"
    proxy, server = ProxyMetrics(), ServerMetrics()
    server.tasks_submitted.inc()

    async def body() -> tuple[httpx.Response, httpx.Response]:
        listener = await listen_metrics([Exposition(server.registry), Exposition(proxy.registry)], "127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(base_url=listener.url) as http:
                return await http.get("/metrics"), await http.get("/rollout/status")
        finally:
            await listener.close()

    metrics, other = asyncio.run(body())
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain; version=")
    samples = parse(metrics.text)
    assert value(samples, "polar_server_tasks_submitted_total") == 1
    assert "polar_proxy_journal_bytes_total" in names(samples)
    assert other.status_code == 404  # nothing else is served there
