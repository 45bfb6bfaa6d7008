"""Group affinity through a real ``polar serve`` with two replicas (``--backend vllm --backend-url A --backend-url
B``; the replicas are tests/proxy/test_pool.py's small servers in vLLM's answer shape): the gateway tells the pool
each session's task, and the samples of one task all sample on that task's replica, a second task's on its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polar_cli.client import AsyncPolarClient
from polar_cli.proxy.journal import read_journal
from tests.proxy.test_pool import groups_homed, home, replicas

from .procs import Serve, serve_config, waiting_task

SAMPLES = 4


def test_the_samples_of_a_task_sample_on_its_replica(tmp_path: Path) -> None:
    async def body() -> None:
        a, b = await replicas(2)
        urls = [a.url, b.url]
        data_dir = tmp_path / "polar-data"
        serve = Serve(data_dir, "--port", "0", "--config", str(serve_config(tmp_path, "serve")), "--backend", "vllm",
                      "--backend-url", a.url, "--backend-url", b.url, "--model", "served-model")  # fmt: skip
        try:
            info = await serve.ready()
            async with AsyncPolarClient(info["url"], info["token"], timeout=60) as client:
                tasks = groups_homed(urls)  # two tasks that prefer different replicas
                for task_id in tasks:
                    await client.submit(waiting_task(task_id, SAMPLES))
                for task_id in tasks:
                    status = await client.wait(task_id, timeout=120)
                    assert status.state == "completed" and len(status.results) == SAMPLES, status
                    calls = [c for s in status.sessions for c in read_journal(data_dir / "journal" / f"{s}.jsonl")]
                    assert len(calls) == 2 * SAMPLES  # the agent's two calls per session
                    assert {c.replica for c in calls} == {home(task_id, urls)}
            assert a.calls == b.calls == 2 * SAMPLES
        finally:
            serve.stop()
            await a.stop()
            await b.stop()

    asyncio.run(asyncio.wait_for(body(), 240))
