"""The inference pool: one gateway's replicas of the inference server, and what a trainer changes under them.

``InferencePool`` is the proxy's ``BackendClient``: every model call goes through it.

- **Routing.** A session stays on its replica while that replica is healthy (its prefix cache keeps the session's
  history); a new session, or one whose replica left, goes to the healthy replica with the fewest calls in flight.
- **Group affinity.** The sessions of one group (a task's samples: ``open_session(..., group=...)``) prefer one
  replica, so the prompt they share is prefilled once there (the server's prefix cache): each group ranks the
  replicas by rendezvous hashing (stable across gateways, and as replicas join or leave), and a new session takes
  the first in its ranking whose calls in flight exceed the least-loaded healthy replica's by at most
  ``PoolConfig.affinity_margin`` (beyond it, the group spills over to its next replica).
- **Cross-policy sampling** (:mod:`polar_cli.proxy.cross_policy`). Stale replicas (``PoolConfig.stale_replicas``)
  take only every ``stale_period``-th weight load and serve only sessions opened with a ``stale_fraction``: each call
  of such a session goes to a stale replica with that probability (least loaded, never pinned), else to the current
  replicas as above. Sessions and group affinity place only on current replicas.
- **Failover.** A call that cannot reach its replica (refused, reset, timed out, 502/503/504) takes that replica out
  of rotation and is tried again on another one within the call's retry budget: the harness sees no error. A health
  check (``GET /v1/models``) re-admits it when it answers again.
- **Pause and resume.** While paused, new model calls wait at the proxy (they are never refused); ``wait`` returns
  once no call is in flight, ``keep`` freezes the calls in flight on their replicas (the server's own keep-mode
  pause). ``resume`` sets the policy version the next calls are sampled under.
- **Versions.** Each replica serves a version (a stale one's lags behind the pool's); each Generation carries the
  version of the replica that sampled it, the replica that answered and, when the
  call was in flight across a version change, the version spans of its tokens (exact for streamed calls: the pool
  counts the tokens it relays).
- **Run-time changes.** ``add`` and ``remove`` (drain: the replica's calls in flight finish first), ``load_weights``
  (pause, every replica reloads from a path with its server's mechanism, resume under the new version).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import Field

from polar_cli.aio import cancel_and_wait
from polar_cli.errors import BackendBusy, BackendError, ConfigError, PauseTimeout, PoolControlError
from polar_cli.interfaces.backend import BackendClient
from polar_cli.metrics import ProxyMetrics, replica_label
from polar_cli.models import StrictModel
from polar_cli.models.chat import INTERRUPTED, ChatRequest, Generation, Rendered, SampledSoFar, UpstreamStream
from polar_cli.models.inference import (
    INITIAL_POLICY_VERSION,
    PauseMode,
    PoolStatus,
    ReplicaRole,
    VersionSpan,
    replica_key,
)
from polar_cli.proxy.cross_policy import StaleSchedule, draws_stale
from polar_cli.proxy.replica import Flight, PooledStream, Replica
from polar_cli.proxy.retry import RetryConfig, with_retries

log = logging.getLogger("polar.proxy.pool")
_R = TypeVar("_R")

_UNHEALTHY_STATUSES = frozenset({502, 503, 504})
"""A retryable failure with one of these statuses means the replica cannot serve (unreachable, cut off, timed out,
overloaded to the point of refusing): it leaves the rotation. A 429 or a 500 is the replica answering: retried,
it stays in."""


class PoolConfig(StrictModel):
    """How a gateway's inference pool watches its replicas."""

    health_interval_s: float = Field(default=2.0, gt=0, description="how often each replica is asked GET /v1/models")
    health_timeout_s: float = Field(default=5.0, gt=0, description="how long a health check waits for its answer")
    group_affinity: bool = Field(
        default=True,
        description="the sessions of one task (a group of samples) prefer one replica, so the prompt they share is "
        "prefilled once (its prefix cache); false: every new session goes to the least-loaded replica",
    )
    affinity_margin: int = Field(
        default=8,
        ge=0,
        description="a group's replica takes a new session of the group while its calls in flight exceed the "
        "least-loaded healthy replica's by at most this many; beyond it the session spills over to the group's next "
        "replica",
    )
    stale_replicas: list[str] = Field(
        default_factory=list,
        description="replica URLs that are stale: they take only every stale_period-th weight load and serve only "
        "the model calls that tasks with agent.sampling.stale_fraction send them (cross-policy sampling)",
    )
    stale_period: int = Field(
        default=2, ge=1, description="the stale replicas take the stale_period-th, 2*stale_period-th, ... weight load"
    )


def rank_replicas(group: str, replicas: Sequence[_R], *, key: Callable[[_R], str]) -> list[_R]:
    """``replicas`` in ``group``'s order of preference: rendezvous (highest random weight) hashing of the group with
    each replica's ``key`` (its URL). Every gateway ranks alike, and a replica joining or leaving moves only the
    groups that rank it first."""

    def weight(replica: _R) -> bytes:
        return hashlib.blake2b(f"{group}\0{key(replica)}".encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


class InferencePool(BackendClient):
    """The replicas of one gateway (``urls``: each made into a client by ``make_client``; ``[None]`` for a backend
    without a URL, such as the scripted one). See the module docstring."""

    def __init__(
        self,
        make_client: Callable[[str | None], BackendClient],
        urls: Sequence[str | None],
        *,
        retry: RetryConfig | None = None,
        timeout_s: float = 600.0,
        config: PoolConfig | None = None,
        policy_version: int = INITIAL_POLICY_VERSION,
        rng: random.Random | None = None,
    ) -> None:
        """``rng``: the cross-policy draws' (a seeded one makes them repeatable)."""
        if not urls:
            raise ConfigError("an inference pool needs at least one backend URL")
        self._make_client = make_client
        self.retry = retry or RetryConfig(attempts=1)
        self.timeout_s = timeout_s
        self.config = config or PoolConfig()
        self._version = policy_version
        self._stale = {replica_key(url) for url in self.config.stale_replicas}
        self._schedule = StaleSchedule(self.config.stale_period)
        self._rng = rng or random.Random()
        self._fractions: dict[str, float] = {}
        """Session id → its stale_fraction (sessions with cross-policy sampling only)."""
        self._stale_warned = False
        self._replicas: list[Replica] = []
        for url in urls:
            self._replicas.append(self._new_replica(url))
        first = self._replicas[0].client
        self.name = first.name  # type: ignore[misc]
        self.session_options = first.session_options  # type: ignore[misc]
        self.streams_token_ids = first.streams_token_ids  # type: ignore[misc]
        self.token_in = first.token_in  # type: ignore[misc]
        self.logprobs_mode = first.logprobs_mode
        if self._replicas and all(r.role == "stale" for r in self._replicas):
            raise ConfigError("proxy.pool.stale_replicas lists every replica of the pool: at least one must be current")
        self._paused: PauseMode | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._waiting = 0
        self._changed = asyncio.Condition()
        self._watchers = 0
        """Pauses and drains waiting for calls to land: only then does a landing wake anyone."""
        self._affinity: dict[str, Replica] = {}
        self._groups: dict[str, str] = {}
        """Session id → its group (the task it samples for): what group affinity ranks replicas by."""
        self._placed = 0
        self._health: asyncio.Task[None] | None = None
        self._closed = False
        self.metrics: ProxyMetrics | None = None
        """Where each upstream attempt is counted and timed, per replica (the proxy's, set by ``ProxyState``)."""

    @classmethod
    def of(cls, client: BackendClient) -> InferencePool:
        """A pool of one ready-made client (no URL to add others by): pause, resume and versions still work."""

        def no_more(url: str | None) -> BackendClient:
            raise ConfigError(f"this pool's {client.name or 'backend'} backend was given ready-made; add no replicas")

        pool = cls(lambda url: client, [None])
        pool._make_client = no_more
        return pool

    def _new_replica(self, url: str | None) -> Replica:
        key = replica_key(url) if url is not None else None
        if key is not None and any(r.url == key for r in self._replicas):
            raise ConfigError(f"backend {key} is in the pool twice")
        role: ReplicaRole = "stale" if key in self._stale else "current"
        return Replica(url=key, client=self._make_client(key), version=self._version, role=role)

    # ---- what the trainer sees ------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def paused(self) -> PauseMode | None:
        return self._paused

    def clients(self) -> list[BackendClient]:
        """The replicas' own clients, healthy ones first (for callers that need one server's particulars)."""
        return [r.client for r in sorted(self._replicas, key=lambda r: r.state != "healthy")]

    def in_flight(self) -> int:
        return sum(len(r.flights) for r in self._replicas)

    def status(self) -> PoolStatus:
        return PoolStatus(policy_version=self._version, paused=self._paused, waiting=self._waiting,
                          in_flight=self.in_flight(), replicas=[r.status() for r in self._replicas])  # fmt: skip

    async def pause(self, mode: PauseMode = "wait", timeout_s: float = 300.0) -> PoolStatus:
        """Hold new calls at the proxy; ``wait``: return once no call is in flight (PauseTimeout naming the calls
        still in flight after ``timeout_s``; the pool stays paused); ``keep``: freeze the calls in flight on servers
        that can (the others' calls run on)."""
        self._open.clear()
        self._paused = mode
        if mode == "keep":
            await self._freeze(timeout_s)
            return self.status()
        if mode == "abort":
            for replica in self._replicas:
                for flight in replica.flights:
                    if flight.interrupt is not None:
                        flight.interrupt.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._until(lambda: self.in_flight() == 0)
        except TimeoutError:
            raise PauseTimeout(
                f"the pause timed out after {timeout_s:g} s waiting for {self._describe_flights()} to finish; "
                f"the pool stays paused (resume it, or pause again with a longer timeout)"
            ) from None
        return self.status()

    async def resume(self, policy_version: int | None = None) -> PoolStatus:
        """Calls held at the proxy go on, sampled under ``policy_version`` (None: the current version + 1)."""
        self._set_version(self._version + 1 if policy_version is None else policy_version)
        await self._thaw()
        self._paused = None
        self._open.set()
        return self.status()

    async def sync(self, policy_version: int, paused: PauseMode | None) -> PoolStatus:
        """Take on the rollout server's state (when a gateway registers): its version, and whether it is paused."""
        self._set_version(policy_version)
        if paused is None:
            await self._thaw()
            self._paused = None
            self._open.set()
        else:
            self._open.clear()
            self._paused = paused
        return self.status()

    async def load_weights(
        self,
        path: str,
        *,
        policy_version: int | None = None,
        timeout_s: float = 300.0,
        urls: Sequence[str] | None = None,
    ) -> PoolStatus:
        """Pause (``wait``), make every replica (or just ``urls``) reload its weights from ``path`` with its
        server's own mechanism, then resume under ``policy_version``. Paused in ``keep`` mode, the calls frozen on the
        servers are not waited for: they go on under the new weights. A pool that was paused already stays paused
        (whoever paused it resumes it: the rollout server, once every gateway sharing these replicas has reloaded).
        A pool with a replica that cannot reload (the scripted backend, an OpenAI-compatible server) is refused with
        PoolControlError (409) before anything is paused. A reload that fails leaves the pool paused and raises
        BackendError naming each replica that failed, and saying that the pool stays paused and why.

        Stale replicas take only every ``stale_period``-th load (:class:`StaleSchedule`); on the others they are left
        out and keep their version. ``urls`` ``[]`` reloads nothing but counts the load (the rollout server's plan: a
        replica several gateways share is reloaded through one, and each counts it)."""
        targets = self._replicas if urls is None else [self._find(url) for url in urls]
        stale_too = self._schedule.takes_next()
        fixed = [r for r in targets if not r.client.reloads_weights]
        if fixed:
            names = ", ".join(sorted({f"the {r.client.name or type(r.client).__name__} backend" for r in fixed}))
            raise PoolControlError(
                f"cannot load weights from {path}: {names} cannot reload weights in place (only vllm and sglang "
                "replicas can); nothing was paused"
            )
        paused_before = self._paused is not None
        if self._paused is None:
            await self.pause("wait", timeout_s)
        # paused in keep mode: the calls frozen on the servers are recomputed under the new weights after the resume
        loading = [r for r in targets if stale_too or r.role == "current"]
        failures = await asyncio.gather(*(self._reload(r, path, timeout_s) for r in loading))
        failed = [f for f in failures if f is not None]
        if failed:
            raise BackendError(
                f"loading weights from {path} failed on {len(failed)} of {len(loading)} replica(s): "
                + "; ".join(failed) + ". The pool stays paused: load again (a failed reload may leave a server without "
                "usable weights: vLLM's does, so resuming on it is not safe)",
                status=502,
            )  # fmt: skip
        self._schedule.loaded()
        for replica in self._replicas:
            replica.held = replica.role == "stale" and not stale_too
        if paused_before:
            return self.status()
        return await self.resume(policy_version)

    async def add(self, url: str) -> PoolStatus:
        """Add a replica (a replica being removed is taken back); it joins the rotation once it answers."""
        if all(r.url is None for r in self._replicas):
            raise ConfigError(
                f"the {self.name or 'scripted'} backend has no server URL: a pool of it takes no replicas"
            )
        key = replica_key(url)
        if not key.startswith(("http://", "https://")):
            raise ConfigError(f"backend URL {url!r} must start with http:// or https://")
        existing = next((r for r in self._replicas if r.url == key), None)
        if existing is not None:
            if existing.state == "draining":
                existing.state = "healthy"
            return self.status()
        replica = self._new_replica(key)
        self._replicas.append(replica)
        if self.metrics is not None:
            self.metrics.replicas_known([replica_label(key)])
        await self._check(replica)
        self._ensure_health_loop()
        return self.status()

    async def remove(self, url: str, timeout_s: float = 300.0) -> PoolStatus:
        """Take a replica out: no new call goes to it, its calls in flight finish (PauseTimeout after ``timeout_s``:
        it stays draining), then it is dropped."""
        replica = self._find(url)
        if not any(r.state != "draining" for r in self._replicas if r is not replica):
            raise ConfigError(f"backend {replica.url} is the pool's last replica: add another before removing it")
        replica.state = "draining"
        self._unpin(replica)
        try:
            async with asyncio.timeout(timeout_s):
                await self._until(lambda: not replica.flights)
        except TimeoutError:
            raise PauseTimeout(
                f"backend {replica.url} still has {len(replica.flights)} call(s) in flight after {timeout_s:g} s; "
                f"it stays draining (remove it again to wait longer)"
            ) from None
        if replica in self._replicas and replica.state == "draining":
            self._replicas.remove(replica)
            await replica.client.close()
        return self.status()

    # ---- BackendClient --------------------------------------------------------------------------------------------

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        if request.token_prompt is not None:
            return await self._generate_resumable(request, session_id)

        async def once(replica: Replica, flight: Flight) -> Generation:
            try:
                generation = await replica.client.generate(request, session_id=session_id)
            finally:
                self._land(flight)
            flight.stamp(generation)
            return generation

        return await self._call(session_id, False, once)

    async def _generate_resumable(self, request: ChatRequest, session_id: str) -> Generation:
        """A token-mode call that an abort-mode pause may stop: what it sampled is kept, and after the resume it goes
        on from its prompt + those ids (as tokens) until it ends; the Generation is the whole answer, its
        ``version_spans`` split where each stretch began."""
        prompt = request.token_prompt
        assert prompt is not None
        sampled = SampledSoFar()
        while True:
            attempt = dataclasses.replace(prompt, sampled=sampled if sampled.ids else None, interrupt=asyncio.Event())
            call = dataclasses.replace(request, token_prompt=attempt)

            async def once(replica: Replica, flight: Flight, call: ChatRequest = call) -> Generation:
                flight.interrupt = call.token_prompt.interrupt if call.token_prompt is not None else None
                try:
                    generation = await replica.client.generate(call, session_id=session_id)
                finally:
                    self._land(flight)
                flight.stamp(generation)
                return generation

            generation = await self._call(session_id, False, once)
            if generation.finish_reason != INTERRUPTED:
                break
            fresh = generation.response_ids  # an interrupted attempt answers only what it sampled itself
            if fresh:
                sampled.versions.append((len(sampled.ids), generation.policy_version or self._version))
                sampled.ids += fresh
                sampled.logprobs += generation.response_logprobs or [0.0] * len(fresh)
        if sampled.versions:
            last = [(s.start, s.version) for s in generation.version_spans or []] or [(0, generation.policy_version)]
            spans = [*sampled.versions, *((None if a is None else a + len(sampled.ids), v) for a, v in last)]
            merged: list[VersionSpan] = []
            for start, version in spans:
                if version is None or (merged and merged[-1].version == version):
                    continue
                merged.append(VersionSpan(start=start, version=version))
            generation.policy_version = merged[0].version if merged else generation.policy_version
            generation.version_spans = merged if len(merged) > 1 else None
        return generation

    async def open_stream(self, request: ChatRequest, *, session_id: str) -> UpstreamStream:
        async def once(replica: Replica, flight: Flight) -> UpstreamStream:
            try:
                inner = await replica.client.open_stream(request, session_id=session_id)
            except BaseException:
                self._land(flight)
                raise
            return PooledStream(self._land, flight, inner)

        return await self._call(session_id, True, once)

    async def count_tokens(self, request: ChatRequest) -> int:
        return await self._pick("", set()).client.count_tokens(request)

    async def render(self, request: ChatRequest, *, add_generation_prompt: bool = True) -> Rendered:
        """Any healthy replica renders (they serve one model with one template)."""
        return await self._pick("", set()).client.render(request, add_generation_prompt=add_generation_prompt)

    async def check_token_in(self, timeout_s: float) -> None:
        """Every replica has the token-in routes (the first that lacks them is the error)."""
        for replica in list(self._replicas):
            await replica.client.check_token_in(timeout_s)

    async def models(self) -> list[str]:
        return await self._pick("", set()).client.models()

    async def context_tokens(self) -> int | None:
        """Any healthy replica's (they serve one model)."""
        return await self._pick("", set()).client.context_tokens()

    async def preflight(self, timeout_s: float) -> None:
        """Every replica is asked at once; an error only when none answers (the others are marked unhealthy and
        re-admitted by the health check when they answer)."""
        results = await asyncio.gather(*(self._probe(r, timeout_s) for r in self._replicas))
        self._ensure_health_loop()
        if all(err is not None for err in results):
            message = "; ".join(str(err) for err in results if err is not None)
            if any(isinstance(err, BackendBusy) for err in results):
                raise BackendBusy(message)  # one that is busy may yet answer: the start-up check waits for it
            raise BackendError(message)
        for err in results:
            if err is not None:
                log.warning("replica out of rotation until it answers: %s", err)

    async def open_session(
        self, session_id: str, options: Mapping[str, Any], *, group: str | None = None,
        stale_fraction: float | None = None,
    ) -> None:  # fmt: skip
        """``group``: the session samples for this group (``sessions.affinity_group``); a group's sessions prefer one
        replica. ``stale_fraction``: each of its calls goes to a stale replica with this probability."""
        if group is not None:
            self._groups[session_id] = group
        if stale_fraction:
            self._fractions[session_id] = stale_fraction
            if not self._stale_warned and not any(r.role == "stale" for r in self._replicas):
                self._stale_warned = True
                log.warning("a task asks for cross-policy sampling (stale_fraction %g) but this pool has no stale "
                            "replica (proxy.pool.stale_replicas): its calls go to the current ones", stale_fraction)
        for replica in list(self._replicas):
            await replica.client.open_session(session_id, options)

    async def close_session(self, session_id: str) -> None:
        self._groups.pop(session_id, None)
        self._fractions.pop(session_id, None)
        pinned = self._affinity.pop(session_id, None)
        if pinned is not None:
            pinned.sessions.discard(session_id)
        for replica in list(self._replicas):
            await replica.client.close_session(session_id)

    async def close(self) -> None:
        self._closed = True
        if self._health is not None:
            await cancel_and_wait(self._health)
            self._health = None
        for replica in self._replicas:
            await replica.client.close()

    # ---- routing and failover -------------------------------------------------------------------------------------

    async def _call(self, session_id: str, streamed: bool, once: Callable[[Replica, Flight], Any]) -> Any:
        """One call: wait while paused, pick a replica, run ``once`` on it. A failure that says the replica cannot
        serve takes it out of rotation and the call goes straight to another healthy replica; other transient
        failures are retried with backoff (``with_retries``: the retry budget and the session's deadline)."""
        self._ensure_health_loop()
        failed: set[Replica] = set()
        tries = 0

        async def attempt(budget_s: float) -> Any:
            nonlocal tries
            while True:
                await self._gate()  # every try passes the pause gate: a retry never slips into a pause
                replica = self._pick(session_id, failed)
                flight = self._take_off(replica, session_id, streamed)
                tries += 1
                began = time.monotonic()
                try:
                    result = await once(replica, flight)
                except BackendError as exc:
                    self._count(replica, exc.status, streamed, began, tries > 1)
                    replica.errors += 1
                    replica.last_error = str(exc)[:500]
                    if replica.url is not None and replica.url not in str(exc):
                        exc.args = (f"{exc} (replica {replica.url})",)
                    if exc.retryable and exc.status in _UNHEALTHY_STATUSES and replica.url is not None:
                        self._mark_unhealthy(replica, exc)
                        failed.add(replica)
                        if any(r.state == "healthy" and r not in failed for r in self._replicas):
                            continue  # straight to another replica: each can fail this call once
                    raise
                self._count(replica, 200, streamed, began, tries > 1)
                replica.calls += 1
                return result

        return await with_retries(attempt, self.retry, timeout_s=self.timeout_s, what="the inference pool")

    def _count(self, replica: Replica, code: int, streamed: bool, began: float, retry: bool) -> None:
        if self.metrics is not None:
            self.metrics.upstream(replica_label(replica.url), code, streamed, time.monotonic() - began, retry)

    def _pick(self, session_id: str, failed: set[Replica]) -> Replica:
        """A session with cross-policy sampling: a stale replica (the least loaded healthy one, not pinned) when its
        draw says so. Else the session's replica while it is healthy; else its group's replica (:meth:`_for_group`);
        else the healthy replica with the fewest calls in flight (then the fewest sessions, then the longest
        unchosen): current replicas only, unless none of them is healthy; with none healthy, the one that failed
        least recently, to try anyway."""
        healthy = [r for r in self._replicas if r.state == "healthy" and r not in failed]
        if session_id in self._fractions and draws_stale(self._rng, self._fractions[session_id]):
            stale = [r for r in healthy if r.role == "stale"]
            if stale:
                return min(stale, key=lambda r: (len(r.flights), r.calls))
        pinned = self._affinity.get(session_id) if session_id else None
        if pinned is not None and pinned.state == "healthy" and pinned not in failed and pinned in self._replicas:
            return pinned
        healthy = [r for r in healthy if r.role == "current"] or healthy
        if healthy:
            group = self._groups.get(session_id) if session_id else None
            best = self._for_group(group, healthy) if group is not None else None
            if best is None:
                best = min(healthy, key=lambda r: (len(r.flights), len(r.sessions), r.chosen_at))
        else:
            candidates = [r for r in self._replicas if r.state != "draining" and r not in failed] or [
                r for r in self._replicas if r.state != "draining"]  # fmt: skip
            if not candidates:
                raise BackendError("the inference pool has no replica to send the call to", status=503)
            best = min(candidates, key=lambda r: len(r.flights))
        if session_id and best.role == "current":  # a stale replica stood in for the current ones: not pinned
            if pinned is not None:
                pinned.sessions.discard(session_id)
            self._affinity[session_id] = best
            best.sessions.add(session_id)
            self._placed += 1
            best.chosen_at = self._placed
        return best

    def _for_group(self, group: str, healthy: list[Replica]) -> Replica | None:
        """The first replica in ``group``'s ranking whose calls in flight exceed the least-loaded one's by at most
        ``affinity_margin`` (None: affinity is off, or there is no choice to make)."""
        if not self.config.group_affinity or len(healthy) < 2:
            return None
        bound = min(len(r.flights) for r in healthy) + self.config.affinity_margin
        ranked = rank_replicas(group, healthy, key=Replica.where)
        chosen = next(r for r in ranked if len(r.flights) <= bound)
        if self.metrics is not None:
            self.metrics.group_placed(spilled=chosen is not ranked[0])
        return chosen

    async def _gate(self) -> None:
        if self._open.is_set():
            return
        self._waiting += 1
        try:
            await self._open.wait()
        finally:
            self._waiting -= 1

    def _take_off(self, replica: Replica, session_id: str, streamed: bool) -> Flight:
        flight = Flight(replica=replica, session_id=session_id, version=replica.version, streamed=streamed)
        replica.flights.add(flight)
        return flight

    def _land(self, flight: Flight) -> None:
        """The call ended (answered, failed or aborted): no longer in flight. Safe to call twice."""
        replica = flight.replica
        if flight in replica.flights:
            replica.flights.discard(flight)
            if self._watchers:
                self._notify()

    async def _until(self, check: Callable[[], bool]) -> None:
        self._watchers += 1
        try:
            async with self._changed:
                await self._changed.wait_for(check)
        finally:
            self._watchers -= 1

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        with contextlib.suppress(RuntimeError):  # no running loop (interpreter shutdown): nobody waits
            asyncio.get_running_loop().create_task(wake())

    def _mark_unhealthy(self, replica: Replica, exc: BaseException) -> None:
        if replica.state == "healthy":
            log.warning("backend %s out of rotation: %s", replica.url, exc)
            replica.state = "unhealthy"
        self._unpin(replica)

    def _unpin(self, replica: Replica) -> None:
        for session_id in replica.sessions:
            if self._affinity.get(session_id) is replica:
                del self._affinity[session_id]
        replica.sessions.clear()

    def _find(self, url: str) -> Replica:
        key = replica_key(url)
        for replica in self._replicas:
            if replica.url == key:
                return replica
        known = ", ".join(r.url for r in self._replicas if r.url) or "none"
        raise ConfigError(f"backend {key} is not in the pool (its replicas: {known})")

    def _describe_flights(self) -> str:
        parts = []
        for replica in self._replicas:
            if replica.flights:
                sessions = sorted({f.session_id for f in replica.flights})
                shown = ", ".join(sessions[:5]) + (f" and {len(sessions) - 5} more" if len(sessions) > 5 else "")
                parts.append(f"{len(replica.flights)} call(s) on {replica.where()} (sessions {shown})")
        return "; ".join(parts) or "no calls"

    # ---- versions and the servers' own pause ----------------------------------------------------------------------

    def _set_version(self, version: int) -> None:
        """The pool samples under ``version`` from now on: every replica but a held stale one serves it."""
        self._version = version
        for replica in self._replicas:
            if not replica.held and replica.version != version:
                replica.version = version
                for flight in replica.flights:
                    flight.crossed(version)

    async def _freeze(self, timeout_s: float) -> None:
        async def freeze(replica: Replica) -> None:
            if replica.frozen or replica.state == "unhealthy":
                return
            try:
                replica.frozen = await replica.client.pause_generation(timeout_s)
            except BackendError as exc:
                log.warning("backend %s could not freeze its calls (they run on): %s", replica.where(), exc)

        await asyncio.gather(*(freeze(r) for r in self._replicas))

    async def _thaw(self) -> None:
        async def thaw(replica: Replica) -> None:
            if not replica.frozen:
                return
            try:
                await replica.client.resume_generation(self.config.health_timeout_s)
                replica.frozen = False
            except BackendError as exc:
                self._mark_unhealthy(replica, exc)

        await asyncio.gather(*(thaw(r) for r in self._replicas))

    async def _reload(self, replica: Replica, path: str, timeout_s: float) -> str | None:
        try:
            await replica.client.reload_weights(path, timeout_s)
        except BackendError as exc:
            return f"{replica.where()}: {exc}"
        return None

    # ---- health ---------------------------------------------------------------------------------------------------

    async def _probe(self, replica: Replica, timeout_s: float) -> BackendError | None:
        try:
            await replica.client.preflight(timeout_s)
        except BackendError as exc:
            self._mark_unhealthy(replica, exc)
            replica.last_error = str(exc)[:500]
            return exc
        return None

    async def _check(self, replica: Replica) -> None:
        """Ask one replica; it is healthy exactly when it answers (a draining one stays draining)."""
        if replica.url is None or replica.state == "draining":
            return
        err = await self._probe(replica, self.config.health_timeout_s)
        if err is None and replica.state == "unhealthy":
            log.info("backend %s answers again: back in rotation", replica.url)
            replica.state = "healthy"

    def _ensure_health_loop(self) -> None:
        if self._health is None and not self._closed and any(r.url is not None for r in self._replicas):
            self._health = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            # only replicas out of rotation are probed: a healthy one is checked by its own traffic (a call that
            # cannot reach it takes it out at once), so a big pool costs its servers nothing while all is well
            await asyncio.gather(*(self._check(r) for r in list(self._replicas) if r.state == "unhealthy"))
