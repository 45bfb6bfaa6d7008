"""The CI check of issue 23: a real ``polar serve`` (server and gateway in one process, the shell harness calling the
proxy, the scripted backend, a trainer callback receiver) is scraped on both ``/metrics`` endpoints, and on the
operator's separate metrics bind, before, during and after a task; every document is parsed with
``prometheus_client``'s own parser."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.server.procs import Receiver, Serve, client, free_port, serve_config, until_true, waiting_task

SAMPLES = 2


def value(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


async def scrape(url: str, token: str | None) -> list[Sample]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.get(url, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples]


def test_both_metrics_endpoints_move_as_sessions_pass_the_stages(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "serve")
    serve = Serve(tmp_path / "polar-data", "--port", "0", "--config", str(config), "--metrics-port", "0")
    marker = tmp_path / "go"
    receiver = Receiver(free_port())

    async def body() -> dict[str, list[Sample]]:
        await receiver.start()
        try:
            return await scraped()
        finally:
            await receiver.close()

    async def scraped() -> dict[str, list[Sample]]:
        info = await serve.ready()
        server_url, gateway_url = f"{info['url']}/metrics", f"{info['gateway_url']}/metrics"
        scrapes: dict[str, list[Sample]] = {}

        async def both(when: str) -> None:
            scrapes[f"server {when}"] = await scrape(server_url, info["token"])
            scrapes[f"gateway {when}"] = await scrape(gateway_url, info["node_token"])

        async with httpx.AsyncClient(timeout=30) as http:  # no token, or the other part's token: refused
            server_token = {"Authorization": f"Bearer {info['token']}"}
            assert (await http.get(server_url)).status_code == 401
            assert (await http.get(gateway_url)).status_code == 401
            assert (await http.get(gateway_url, headers=server_token)).status_code == 401
        await both("before")
        task = waiting_task("metrics-task", SAMPLES, marker, callback_url=receiver.url)
        async with client(info) as http:
            assert (await http.post("/rollout/task/submit", json=task)).status_code == 200

            async def running() -> list[Sample] | None:
                gateway = await scrape(gateway_url, info["node_token"])
                return gateway if value(gateway, "polar_gateway_stage_in_flight", stage="running") == SAMPLES else None

            await until_true(running, "both sessions in RUNNING")
            await both("during")
            marker.touch()
            answer = await http.get("/rollout/task/metrics-task", params={"wait": 120})
            assert answer.json()["state"] == "completed", answer.text[:2000]

        async def delivered() -> bool:
            server = await scrape(server_url, info["token"])
            return value(server, "polar_server_callbacks_total", result="delivered") == SAMPLES + 1

        await until_true(delivered, "every callback delivered")
        await both("after")
        scrapes["bind"] = await scrape(info["metrics_url"], None)  # the operator's bind: no token, both parts
        return scrapes

    try:
        scrapes = asyncio.run(body())
    finally:
        serve.stop()
    check_server(scrapes["server before"], scrapes["server during"], scrapes["server after"])
    check_gateway(scrapes["gateway before"], scrapes["gateway during"], scrapes["gateway after"])
    bind = scrapes["bind"]
    assert value(bind, "polar_server_tasks_submitted_total") == 1
    assert value(bind, "polar_gateway_sessions_finished_total", status="completed") == SAMPLES
    every_label = {v for samples in scrapes.values() for s in samples for v in s.labels.values()}
    session_ids = {f"metrics-task-{i}" for i in range(SAMPLES)} | {"metrics-task"}
    assert not every_label & session_ids
    assert not [v for v in every_label if "metrics-task" in v]


def test_labelled_counters_are_there_at_zero_on_a_fresh_server(tmp_path: Path) -> None:
    """Before any callback or retry, the counters a README panel plots are exported at 0 for their known label
    values (absent, the panel says "No data")."""
    serve = Serve(tmp_path / "polar-data", "--port", "0", "--config", str(serve_config(tmp_path, "serve")))

    async def scrapes() -> tuple[list[Sample], list[Sample]]:
        info = await serve.ready()
        return (await scrape(f"{info['url']}/metrics", info["token"]),
                await scrape(f"{info['gateway_url']}/metrics", info["node_token"]))  # fmt: skip

    try:
        server, gateway = asyncio.run(scrapes())
    finally:
        serve.stop()
    callbacks = {(s.labels["kind"], s.labels["result"]): s.value for s in server
                 if s.name == "polar_server_callbacks_total"}  # fmt: skip
    assert callbacks == {(k, r): 0.0 for k in ("session_result", "task_status") for r in ("delivered", "failed")}
    retries = {s.labels["replica"]: s.value for s in gateway if s.name == "polar_inference_retries_total"}
    assert retries == {"in-process": 0.0}  # the scripted backend: one replica without a URL


def check_server(before: list[Sample], during: list[Sample], after: list[Sample]) -> None:
    assert value(before, "polar_server_tasks_submitted_total") == 0
    assert value(after, "polar_server_tasks_submitted_total") == 1
    assert (
        value(during, "polar_server_sessions", state="running")
        + value(during, "polar_server_sessions", state="dispatched")
        == SAMPLES
    )
    assert value(after, "polar_server_sessions", state="finished") == SAMPLES
    assert value(after, "polar_server_tasks", state="completed") == 1
    assert value(after, "polar_server_session_dispatches_total") == SAMPLES
    assert value(before, "polar_server_sessions_finished_total") == 0
    assert value(after, "polar_server_sessions_finished_total", status="completed") == SAMPLES
    assert value(after, "polar_server_callbacks_total", kind="session_result", result="delivered") == SAMPLES
    assert value(after, "polar_server_callbacks_total", kind="task_status", result="delivered") == 1
    assert value(after, "polar_server_callbacks_pending") == 0
    assert value(after, "polar_server_nodes", healthy="true", draining="false") == 1
    assert value(after, "polar_server_policy_version") == 1
    assert value(after, "polar_server_inference_paused") == 0


def check_gateway(before: list[Sample], during: list[Sample], after: list[Sample]) -> None:
    stages: dict[str, Any] = {}
    for name in ("polar_gateway_sessions_submitted_total", "polar_gateway_sessions_active"):
        stages[name] = [value(s, name) for s in (before, during, after)]
    assert stages["polar_gateway_sessions_submitted_total"] == [0, SAMPLES, SAMPLES]
    assert stages["polar_gateway_sessions_active"] == [0, SAMPLES, 0]
    assert value(during, "polar_gateway_stage_capacity", stage="running") == 3
    assert value(during, "polar_gateway_run_slot_busy_seconds_total") > 0
    assert value(after, "polar_gateway_sessions_finished_total", status="completed") == SAMPLES
    for stage in ("init", "running", "build", "evaluate", "teardown", "total"):
        counts = [value(s, "polar_gateway_stage_duration_seconds_count", stage=stage) for s in (before, during, after)]
        assert counts == [0, 0, SAMPLES], (stage, counts)
    assert value(after, "polar_gateway_stage_duration_seconds_sum", stage="running") > 0
    generate = {"endpoint": "generate", "code": "200", "stream": "false", "provider": "openai_chat"}
    calls = [value(s, "polar_proxy_requests_total", **generate) for s in (before, during, after)]
    assert calls == [0, 0, 2 * SAMPLES], calls  # each agent makes two calls once the marker exists
    assert value(after, "polar_proxy_completions_total", delivery="answered") == 2 * SAMPLES
    assert value(after, "polar_proxy_prompt_tokens_total") > 0
    assert value(after, "polar_proxy_sampled_tokens_total") > 0
    assert value(after, "polar_proxy_journal_bytes_total") > 0
    assert value(after, "polar_inference_upstream_requests_total", replica="in-process", code="200") == 2 * SAMPLES
    assert value(after, "polar_inference_upstream_duration_seconds_count") == 2 * SAMPLES
    assert value(after, "polar_inference_policy_version") == 1
    assert value(after, "polar_inference_paused") == 0
    assert value(after, "polar_inference_replica_healthy", replica="in-process") == 1
