"""The rollout server's side of its gateways' inference pools (docs/service.md, "Weight updates").

The server holds the policy version and whether sampling is paused, kept in its store (a restart keeps both) and
handed to every gateway that registers; each change is told to every live gateway at once (concurrently, so a pause
over eight gateways takes as long as the slowest of them). Changes (pause, resume, load weights, add and remove a
replica) run one at a time, in the order they came; ``status`` and ``cancel_stale`` never wait for one.

A gateway that fails, does not answer in time, or refuses makes the call fail with a message naming each such gateway
and what it said: ``ConfigError`` (400) when every one of them refused the input itself (400/422), else
``PoolControlError`` (409). The gateways that did it keep what they did (a pause stays in force: resume, or pause
again), and a failed pause or load_weights says so in its message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, get_args

from pydantic import BaseModel

from polar_cli.errors import ConfigError, PolarError, PoolControlError
from polar_cli.models.inference import PauseMode, PoolStatus, is_remote, replica_key
from polar_cli.models.service import GatewayPool, InferenceStatus
from polar_cli.node_protocol import (
    BackendBody,
    CancelStaleAnswer,
    CancelStaleBody,
    GatewayClient,
    LoadWeightsBody,
    PauseBody,
    Reply,
    ResumeBody,
)
from polar_cli.server.store import NodeRow, SessionStore
from polar_cli.server.store_threads import StoreThreads

STATE_KEY = "inference"
"""The store's meta key holding ``{"policy_version": int, "paused": mode or null}``."""

A = TypeVar("A", bound=BaseModel)


@dataclass(frozen=True)
class Answered(Generic[A]):
    """One gateway's answer to one fan-out call."""

    node: NodeRow
    reply: Reply[A]


def _urls(pool: PoolStatus) -> set[str]:
    return {replica_key(replica.url) for replica in pool.replicas}


def reload_plan(pools: Sequence[tuple[NodeRow, PoolStatus]]) -> dict[str, list[str]]:
    """node_id → the replica URLs that node reloads: every distinct inference server exactly once, by the first node
    (in ``pools`` order) that lists it, so a server several gateways share is reloaded once. A replica inside a
    gateway's process (the scripted backend) is nobody's to reload."""
    taken: set[str] = set()
    plan: dict[str, list[str]] = {}
    for node, pool in pools:
        keys = [replica_key(replica.url) for replica in pool.replicas if is_remote(replica.url)]
        plan[node.node_id] = mine = [key for key in dict.fromkeys(keys) if key not in taken]
        taken.update(mine)
    return plan


def _failure(what: str, answered: Sequence[Answered[A]], then: str | None = None) -> PolarError | None:
    """The error naming every gateway that did not answer ``what`` with a 2xx it could read, and ``then`` (what that
    leaves behind: before the gateways' own words, which may be long); None when all did."""
    failed = [a for a in answered if a.reply.answer is None]
    if not failed:
        return None
    said = "; ".join(f"{a.node.node_id} ({a.node.url}) {_said(a.reply)}" for a in failed)
    leaves = f". {then}" if then else ""
    message = f"{what} failed on {len(failed)} of {len(answered)} gateways{leaves}: {said}"
    if all(a.reply.status in (400, 422) for a in failed):
        return ConfigError(message)
    return PoolControlError(message)


STAYS_PAUSED = (
    "Sampling stays paused on every gateway that paused, and on any that registers: pause again once the gateway is "
    "back, or resume"
)
RELOAD_FAILED = (
    "Sampling stays paused under the old version: load again (a failed reload can leave an inference server without "
    "usable weights, so resuming on it is not safe)"
)


def _said(reply: Reply[A]) -> str:
    if reply.status is None:
        return f"did not answer: {reply.error}"
    return f"answered {reply.status}: {reply.error}"


class InferenceControl:
    """The policy version and the pause, kept in ``store``, relayed to the live nodes ``nodes()`` lists."""

    def __init__(
        self,
        store: SessionStore,
        threads: StoreThreads,
        gateways: GatewayClient,
        nodes: Callable[[], list[NodeRow]],
        initial_version: int,
    ) -> None:
        self.store = store
        self.threads = threads
        self.gateways = gateways
        self.nodes = nodes
        self.policy_version = initial_version
        self.paused: PauseMode | None = None
        kept = store.meta(STATE_KEY)
        if kept is not None:
            state = json.loads(kept)
            self.policy_version = int(state["policy_version"])
            self.paused = state["paused"] if state["paused"] in get_args(PauseMode) else None
        self._changing = asyncio.Lock()

    # ---- answers ------------------------------------------------------------------------------------------------

    async def status(self) -> InferenceStatus:
        """``GET /inference``: every live gateway's pool, or what it answered instead (nothing fails here)."""
        return self._status(await self._each(self.nodes(), self.gateways.inference))

    def _status(self, answered: Iterable[Answered[PoolStatus]]) -> InferenceStatus:
        gateways = [
            GatewayPool(
                node_id=a.node.node_id,
                url=a.node.url,
                pool=a.reply.answer,
                error=None if a.reply.answer is not None else _said(a.reply),
            )
            for a in answered
        ]
        return InferenceStatus(policy_version=self.policy_version, paused=self.paused, gateways=gateways)

    # ---- changes ------------------------------------------------------------------------------------------------

    async def pause(self, body: PauseBody) -> InferenceStatus:
        """Every gateway holds new model calls; answered when every pool is quiet (``wait``) or frozen (``keep``)."""
        async with self._changing:
            await self._keep(self.policy_version, body.mode)
            pause = self._all("pause", self.nodes(), lambda node: self.gateways.pause(node, body), then=STAYS_PAUSED)
            return self._status(await pause)

    async def resume(self, body: ResumeBody) -> InferenceStatus:
        """Every gateway samples again, under ``body.policy_version`` (default: the current one + 1)."""
        async with self._changing:
            return await self._resume(self._next(body.policy_version))

    async def load_weights(self, body: LoadWeightsBody) -> InferenceStatus:
        """Every gateway pauses (``wait``); each inference server reloads from ``body.path`` once, through one gateway
        that lists it (every gateway is told, with its share of the servers, so each counts the load for its stale
        replicas: ``PoolConfig.stale_period``); then every gateway resumes under the new version (default: the
        current one + 1). Nothing is paused when the version would go back or no gateway lists a server; a failed
        reload leaves sampling paused."""
        if body.urls is not None:
            raise ConfigError("urls: the server chooses which gateway reloads each replica; leave it out")
        async with self._changing:
            version = self._next(body.policy_version)
            pools = await self._pools("load_weights")
            plan = reload_plan([(a.node, self._pool(a)) for a in pools])
            if not any(plan.values()):
                raise PoolControlError(
                    f"no gateway lists an inference server to reload from {body.path} (a scripted backend loads no "
                    "weights); nothing was paused"
                )
            await self._keep(self.policy_version, "wait")
            pause = PauseBody(mode="wait", timeout_s=body.timeout_s)
            await self._all("pause", self.nodes(), lambda node: self.gateways.pause(node, pause), then=STAYS_PAUSED)

            def load(node: NodeRow) -> Awaitable[Reply[PoolStatus]]:
                mine = body.model_copy(update={"policy_version": version, "urls": plan[node.node_id]})
                return self.gateways.load_weights(node, mine)

            try:
                # every gateway is told, those with nothing to reload too: each counts the load for its stale replicas
                nodes = [a.node for a in pools]
                await self._all(f"load_weights from {body.path}", nodes, load, then=RELOAD_FAILED)
            except PolarError:
                # a gateway whose own reloads succeeded has resumed: pause it again, as the failure says
                await self._each(self.nodes(), lambda node: self.gateways.pause(node, pause))
                raise
            return await self._resume(version)

    async def add_backend(self, body: BackendBody) -> InferenceStatus:
        """Every gateway whose pool lacks replica ``body.url`` adds it."""
        async with self._changing:
            pools = await self._pools("add_backend")
            wanted = [a.node for a in pools if replica_key(body.url) not in _urls(self._pool(a))]
            added = await self._all("add_backend", wanted, lambda node: self.gateways.add_backend(node, body))
            return self._status(self._merge(pools, added))

    async def remove_backend(self, body: BackendBody) -> InferenceStatus:
        """Every gateway whose pool has replica ``body.url`` drains it and drops it."""
        async with self._changing:
            pools = await self._pools("remove_backend")
            having = [a.node for a in pools if replica_key(body.url) in _urls(self._pool(a))]
            if not having:
                raise ConfigError(f"no gateway has replica {body.url} (GET /inference lists them)")
            removed = await self._all("remove_backend", having, lambda node: self.gateways.remove_backend(node, body))
            return self._status(self._merge(pools, removed))

    async def cancel_stale(self, body: CancelStaleBody) -> CancelStaleAnswer:
        """Every gateway cancels (status ``stale``) its running sessions whose oldest completion is older than
        ``body.older_than`` (default: the current policy version)."""
        older_than = self.policy_version if body.older_than is None else body.older_than
        told = CancelStaleBody(older_than=older_than)
        answered = await self._all("cancel_stale", self.nodes(), lambda node: self.gateways.cancel_stale(node, told))
        cancelled = [sid for a in answered if a.reply.answer is not None for sid in a.reply.answer.cancelled]
        return CancelStaleAnswer(cancelled=sorted(cancelled))

    # ---- helpers ------------------------------------------------------------------------------------------------

    def _next(self, asked: int | None) -> int:
        """The version to resume under: ``asked``, else the current one + 1; never lower than the current one."""
        if asked is None:
            return self.policy_version + 1
        if asked < self.policy_version:
            raise PoolControlError(
                f"policy_version {asked} is older than the current {self.policy_version}: versions never go back "
                f"(resume with {self.policy_version} or more)"
            )
        return asked

    async def _resume(self, version: int) -> InferenceStatus:
        await self._keep(version, None)
        body = ResumeBody(policy_version=version)
        return self._status(await self._all("resume", self.nodes(), lambda node: self.gateways.resume(node, body)))

    async def _keep(self, version: int, paused: PauseMode | None) -> None:
        """Store the state (a restart keeps it), then take it on: a gateway registering from now on gets it."""
        state = json.dumps({"policy_version": version, "paused": paused})
        await self.threads.write(self.store.set_meta, STATE_KEY, state)
        self.policy_version, self.paused = version, paused

    async def _pools(self, what: str) -> list[Answered[PoolStatus]]:
        nodes = self.nodes()
        if not nodes:
            raise PoolControlError(f"{what}: no gateway is registered and alive")
        return await self._all("GET /inference", nodes, self.gateways.inference)

    @staticmethod
    def _pool(answered: Answered[PoolStatus]) -> PoolStatus:
        assert answered.reply.answer is not None  # _all checked it
        return answered.reply.answer

    @staticmethod
    def _merge(before: list[Answered[PoolStatus]], after: list[Answered[PoolStatus]]) -> list[Answered[PoolStatus]]:
        """Each node's latest answer, in ``before``'s order."""
        latest = {a.node.node_id: a for a in after}
        return [latest.get(a.node.node_id, a) for a in before]

    @staticmethod
    async def _each(nodes: list[NodeRow], send: Callable[[NodeRow], Awaitable[Reply[A]]]) -> list[Answered[A]]:
        """``send`` to every node at once; every answer, failures included."""
        replies = await asyncio.gather(*(send(node) for node in nodes))
        return [Answered(node, reply) for node, reply in zip(nodes, replies, strict=True)]

    async def _all(
        self,
        what: str,
        nodes: list[NodeRow],
        send: Callable[[NodeRow], Awaitable[Reply[A]]],
        then: str | None = None,
    ) -> list[Answered[A]]:
        """As ``_each``, but any node that failed makes it raise (naming each, and saying ``then``)."""
        answered = await self._each(nodes, send)
        error = _failure(what, answered, then)
        if error is not None:
            raise error
        return answered
