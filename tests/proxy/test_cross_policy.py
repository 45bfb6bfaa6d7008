"""Cross-policy sampling: stale replicas that take every ``stale_period``-th weight load, and the per-call draw that
sends a session's calls to them with its ``stale_fraction``. The replicas here are in-process backends whose weights
are a path (``Weights``) and fake vLLM servers (``Replica``); tests/server/test_cross_policy_vllm.py does it on two
real vLLM servers behind ``polar serve``."""

from __future__ import annotations

import asyncio
import io
import math
import random
from collections import Counter

import pytest
from pydantic import ValidationError
from rich.console import Console

from polar_cli.commands.inference import pools_table
from polar_cli.errors import BackendError, ConfigError
from polar_cli.interfaces.backend import BackendClient
from polar_cli.models.service import GatewayPool, InferenceStatus
from polar_cli.models.task import SamplingSpec
from polar_cli.proxy.cross_policy import StaleSchedule, draws_stale
from polar_cli.proxy.pool import InferencePool, PoolConfig, rank_replicas

from .test_pool import FAST, Weights, chat, replicas, run, vllm

CURRENT, STALE = "http://current:1", "http://stale:1"


def within_binomial(hits: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    """``hits`` of ``n`` trials lies within ``sigmas`` standard deviations of a Binomial(n, p)'s mean."""
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.9])
def test_a_draw_goes_stale_with_the_fraction(fraction: float) -> None:
    rng = random.Random(7)
    n = 4000
    assert within_binomial(sum(draws_stale(rng, fraction) for _ in range(n)), n, fraction)


def test_no_fraction_never_draws_stale_and_one_always_does() -> None:
    rng = random.Random(0)
    assert not any(draws_stale(rng, f) for f in (None, 0.0) for _ in range(200))
    assert all(draws_stale(rng, 1.0) for _ in range(200))


@pytest.mark.parametrize(("period", "takes"), [(1, "TTTTTT"), (2, "FTFTFT"), (3, "FFTFFT")])
def test_the_stale_replicas_take_every_periodth_load(period: int, takes: str) -> None:
    schedule = StaleSchedule(period)
    seen = ""
    for _ in takes:
        seen += "T" if schedule.takes_next() else "F"
        schedule.loaded()
    assert seen == takes


def test_the_fraction_is_a_probability() -> None:
    assert SamplingSpec(stale_fraction=0.3).forced() == {"stale_fraction": 0.3}
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="stale_fraction"):
            SamplingSpec(stale_fraction=bad)


def weights_pool(period: int = 2, seed: int = 0) -> tuple[InferencePool, dict[str | None, Weights]]:
    made: dict[str | None, Weights] = {}

    def make(url: str | None) -> BackendClient:
        made[url] = Weights(url)
        return made[url]

    config = FAST.model_copy(update={"stale_replicas": [STALE + "/v1"], "stale_period": period})
    return InferencePool(make, [CURRENT, STALE], config=config, rng=random.Random(seed)), made


def versions(pool: InferencePool) -> dict[str, tuple[str, int | None]]:
    return {r.url: (r.role, r.policy_version) for r in pool.status().replicas}


def test_each_call_of_a_cross_policy_session_goes_stale_with_its_fraction_and_records_that_replicas_version() -> None:
    async def test() -> None:
        pool, _ = weights_pool()
        try:
            await pool.load_weights("/ckpt/1")  # the stale replica skips it: it serves version 1, the current one 2
            assert versions(pool) == {CURRENT: ("current", 2), STALE: ("stale", 1)}
            await pool.open_session("cross", {}, group="task-1", stale_fraction=0.3)
            await pool.open_session("plain", {}, group="task-1")
            n = 1000
            cross = [await pool.generate(chat(), session_id="cross") for _ in range(n)]
            by_replica = Counter((g.replica, g.policy_version) for g in cross)
            assert set(by_replica) == {(CURRENT, 2), (STALE, 1)}
            assert within_binomial(by_replica[STALE, 1], n, 0.3), by_replica
            # a session without a fraction never reaches the stale replica
            plain = {(g.replica, g.policy_version) for g in [await pool.generate(chat(), session_id="plain")
                                                             for _ in range(50)]}  # fmt: skip
            assert plain == {(CURRENT, 2)}
            # only current replicas hold sessions (a stale call pins nothing)
            assert {r.url: r.sessions for r in pool.status().replicas} == {CURRENT: 2, STALE: 0}
        finally:
            await pool.close()

    run(test)


def test_the_stale_replica_reloads_on_every_periodth_load_and_keeps_its_version_between() -> None:
    async def test() -> None:
        pool, made = weights_pool(period=2)
        try:
            made[CURRENT].fail = True
            with pytest.raises(BackendError, match="disk full"):
                await pool.load_weights("/ckpt/bad")
            made[CURRENT].fail = False  # a failed load is not counted: loading again is the same update
            await pool.load_weights("/ckpt/1")  # the pool stayed paused: its caller resumes it
            await pool.resume()
            assert made[STALE].loaded == [] and made[CURRENT].loaded == ["/ckpt/1"]
            assert versions(pool) == {CURRENT: ("current", 2), STALE: ("stale", 1)}
            await pool.pause()
            assert (await pool.resume()).policy_version == 3  # a bump without a reload passes a held replica by
            assert versions(pool) == {CURRENT: ("current", 3), STALE: ("stale", 1)}
            await pool.load_weights("/ckpt/2")  # the second load: the stale replica takes it
            assert made[STALE].loaded == ["/ckpt/2"] and made[CURRENT].loaded == ["/ckpt/1", "/ckpt/2"]
            assert versions(pool) == {CURRENT: ("current", 4), STALE: ("stale", 4)}
            await pool.pause()
            await pool.resume()  # up to date again: it follows a bump
            assert versions(pool) == {CURRENT: ("current", 5), STALE: ("stale", 5)}
            await pool.pause()  # the rollout server's plan: this gateway reloads nothing, but counts the load
            await pool.load_weights("/ckpt/3", urls=[])
            await pool.resume(6)
            assert made[CURRENT].loaded[-1] == "/ckpt/2"
            assert versions(pool) == {CURRENT: ("current", 6), STALE: ("stale", 5)}
        finally:
            await pool.close()

    run(test)


def test_with_no_current_replica_healthy_a_stale_one_stands_in_and_a_pool_of_only_stale_ones_is_refused() -> None:
    async def test() -> None:
        a, b = await replicas(2)
        config = FAST.model_copy(update={"stale_replicas": [b.url], "health_interval_s": 60.0})
        pool = InferencePool(vllm, [a.url, b.url], config=config)
        try:
            assert (await pool.generate(chat(), session_id="s")).replica == a.url
            await a.stop()
            assert (await pool.generate(chat(), session_id="s")).replica == b.url  # failover, unknown to the harness
            assert {r.url: r.sessions for r in pool.status().replicas} == {a.url: 0, b.url: 0}
        finally:
            await pool.close()
            await b.stop()

    run(test)
    with pytest.raises(ConfigError, match="at least one must be current"):
        InferencePool(vllm, [STALE], config=PoolConfig(stale_replicas=[STALE]))


def test_polar_inference_status_shows_each_replicas_role_and_version() -> None:
    async def loaded_once() -> InferenceStatus:
        pool, _ = weights_pool()
        try:
            await pool.load_weights("/ckpt/1")
            return InferenceStatus(policy_version=2, gateways=[GatewayPool(node_id="n1", url="http://n1",
                                                                           pool=pool.status())])  # fmt: skip
        finally:
            await pool.close()

    out = io.StringIO()
    Console(file=out, width=200).print(pools_table(asyncio.run(loaded_once())))
    rows = {cells[3].strip(): [c.strip() for c in cells[4:6]] for line in out.getvalue().splitlines()
            if "http://" in line and len(cells := line.split("│")) > 6}  # fmt: skip
    assert rows == {CURRENT: ["current", "2"], STALE: ["stale", "1"]}


def test_group_affinity_places_a_cross_policy_groups_sessions_on_current_replicas_only() -> None:
    async def test() -> None:
        urls = ["http://c1:1", "http://c2:1", STALE]
        config = FAST.model_copy(update={"stale_replicas": [STALE]})
        pool = InferencePool(Weights, urls, config=config, rng=random.Random(3))
        try:
            home = rank_replicas("task-9", ["http://c1:1", "http://c2:1"], key=str)[0]
            for i in range(4):
                await pool.open_session(f"s{i}", {}, group="task-9", stale_fraction=0.5)
            answered = [(await pool.generate(chat(), session_id=f"s{i}")).replica for i in range(4) for _ in range(20)]
            assert set(answered) == {home, STALE}  # each call: the group's current replica, or the stale one
            assert {r.url: r.sessions for r in pool.status().replicas} == {"http://c1:1": 0, "http://c2:1": 0} | {
                home: 4, STALE: 0}  # fmt: skip
        finally:
            await pool.close()

    run(test)
