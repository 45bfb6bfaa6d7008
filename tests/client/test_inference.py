"""The inference pools through a real ``polar serve`` (server + embedded gateway, scripted backend): the Python
clients, ``polar inference ...`` and the trainer loop of docs/service.md ("Weight updates")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.client import AsyncPolarClient, PolarClient
from polar_cli.errors import AuthError, ConfigError, PoolControlError
from polar_cli.models import InferenceStatus
from polar_cli.node_protocol import CancelStaleAnswer
from tests.client.conftest import TOKEN, Served, start_serve, stop
from tests.gateway.test_node import task
from tests.support.docs import ROOT, code_blocks

WIDE = {"COLUMNS": "200"}


@pytest.fixture
def own_serve(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    """A data dir and the ``polar serve`` processes a test starts on it (stopped at the end)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield tmp_path / "data", procs
    finally:
        for proc in procs:
            stop(proc)


def test_status_pause_resume_and_the_version_across_a_restart(
    own_serve: tuple[Path, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    data_dir, procs = own_serve
    proc, url = start_serve(data_dir, tmp_path / "serve-1.log")
    procs.append(proc)
    with PolarClient(url, TOKEN) as client:
        status = client.inference()
        assert (status.policy_version, status.paused) == (1, None)
        [gateway] = status.gateways  # the embedded gateway and its pool
        assert gateway.pool is not None and gateway.error is None and gateway.pool.policy_version == 1
        paused = client.pause(timeout=30)
        assert paused.paused == "wait" and paused.gateways[0].pool is not None
        assert paused.gateways[0].pool.paused == "wait"
        resumed = client.resume()
        assert (resumed.policy_version, resumed.paused) == (2, None)
        assert resumed.gateways[0].pool is not None and resumed.gateways[0].pool.policy_version == 2
        with pytest.raises(PoolControlError, match="policy_version 1 is older than the current 2"):
            client.resume(1)
        assert client.resume(5).policy_version == 5
        client.pause("keep", timeout=30)
    stop(proc)

    proc, url = start_serve(data_dir, tmp_path / "serve-2.log")  # the same data dir: the state is kept
    procs.append(proc)
    with PolarClient(url, TOKEN) as client:
        status = client.inference()
        assert (status.policy_version, status.paused) == (5, "keep")
        pool = status.gateways[0].pool
        assert pool is not None and (pool.policy_version, pool.paused) == (5, "keep")  # told when it registered
        assert client.resume().policy_version == 6


def test_the_async_client_and_the_errors_it_maps(served: Served) -> None:
    async def body() -> None:
        async with AsyncPolarClient(served.url, served.token) as client:
            status = await client.inference()
            assert isinstance(status, InferenceStatus) and len(status.gateways) == 1
            assert (await client.cancel_stale()) == CancelStaleAnswer(cancelled=[])
            with pytest.raises(ConfigError):
                await client.pause(timeout=0)  # the server's 400: timeout_s must be above 0
            with pytest.raises(ConfigError, match=r"no gateway has replica http://127\.0\.0\.1:9"):
                await client.remove_backend("http://127.0.0.1:9")
            with pytest.raises(ConfigError, match=r"add_backend failed on 1 of 1 gateways: .* 400: .*no server URL"):
                await client.add_backend("http://127.0.0.1:9")  # a scripted pool takes no inference servers
            with pytest.raises(PoolControlError, match="a scripted backend loads no weights"):
                await client.load_weights("/ckpt/step-1")
            assert (await client.inference()).paused is None  # nothing was paused
        async with AsyncPolarClient(served.url, "wrong") as client:
            with pytest.raises(AuthError):
                await client.inference()

    asyncio.run(body())
    with httpx.Client(base_url=served.url, timeout=30) as http:
        assert http.get("/inference").status_code == 401
        assert http.post("/inference/pause", json={"mode": "wait"}).status_code == 401
        auth = {"Authorization": f"Bearer {served.token}"}
        bad = http.post("/inference/resume", json={"policy_version": 2, "mode": "keep"}, headers=auth)
        assert bad.status_code == 400 and "unknown field 'mode'" in bad.json()["error"]["message"]


def test_cancel_stale_ends_a_session_sampled_under_an_older_version(served: Served, tmp_path: Path) -> None:
    called = tmp_path / "called"
    spec = task("stale-one", {"CALLS": "1", "HANG": "1", "PID_FILE": str(called)})
    with PolarClient(served.url, served.token) as client:
        start = client.inference().policy_version
        client.submit(spec)
        end = time.monotonic() + 60
        while not called.exists():  # its one model call made (under `start`), the agent now hangs
            assert time.monotonic() < end, "the agent did not make its call"
            time.sleep(0.05)
        assert client.cancel_stale().cancelled == []  # its completion is not older than the current version
        client.resume()
        assert client.cancel_stale(older_than=start + 1).cancelled == list(client.status("stale-one").sessions)
        final = client.wait("stale-one", timeout=60)
    [result] = final.results
    assert result.status == "stale" and final.state in ("completed", "failed")
    assert final.sessions == {result.session_id: "finished"}  # final: not sent again


def test_polar_inference_commands_against_a_live_server(served: Served) -> None:
    server = ["--server", served.url, "--token", served.token]

    def polar(*args: str) -> Any:
        return CliRunner().invoke(build_app(), ["inference", *args, *server], env=WIDE)

    shown = polar("status")
    assert shown.exit_code == 0, shown.output
    assert "policy version" in shown.stdout and "inference pools" in shown.stdout
    as_json = InferenceStatus.model_validate_json(polar("status", "--json").stdout)
    paused = polar("pause", "--mode", "keep", "--timeout", "30")
    assert paused.exit_code == 0, paused.output
    assert "paused (keep)" in paused.stdout
    resumed = polar("resume", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert InferenceStatus.model_validate_json(resumed.stdout).policy_version == as_json.policy_version + 1
    again = polar("resume", "--policy-version", str(as_json.policy_version))  # the CLI's main makes it one line
    assert isinstance(again.exception, PoolControlError) and "older than the current" in str(again.exception)
    stale = polar("cancel-stale", "--json")
    assert stale.exit_code == 0 and json.loads(stale.stdout) == {"cancelled": []}
    bad = polar("pause", "--mode", "later")
    assert bad.exit_code == 2 and "later" in bad.output
    missing = polar("remove", "http://127.0.0.1:9")
    assert isinstance(missing.exception, ConfigError) and "no gateway has replica" in str(missing.exception)


TRAINER = """
url, token, steps = {url!r}, {token!r}, 2
trained, updates = [], []


def batch(step):
    return [{task!r} | {{"task_id": f"loop-{{step}}"}}]


def train_on(traces):
    trained.append([(trace.reward, trace.policy_versions and trace.policy_versions.newest) for trace in traces])


def update_weights(step):
    updates.append(step)

"""


def test_the_trainer_loop_of_the_docs_runs(served: Served) -> None:
    [loop] = [b for b in code_blocks(ROOT / "docs" / "service.md")
              if b.tested_by == "tests/client/test_inference.py::test_the_trainer_loop_of_the_docs_runs"]  # fmt: skip
    with PolarClient(served.url, served.token) as client:
        before = client.inference().policy_version
    spec = task("loop", {"CALLS": "1"}).model_dump(mode="json")
    scope: dict[str, Any] = {}
    exec(TRAINER.format(url=served.url, token=served.token, task=spec) + loop.text, scope)
    assert scope["updates"] == [0, 1]
    assert [len(step) for step in scope["trained"]] == [1, 1]  # one trace per step (one completion each)
    first, second = (step[0][1] for step in scope["trained"])
    assert first == before and second in (before, before + 1)  # batch 1 samples before or after the first update
    with PolarClient(served.url, served.token) as client:
        assert client.inference().policy_version == before + 2
        assert client.wait("loop-2", timeout=60).state == "completed"  # the last batch, submitted in step 1
