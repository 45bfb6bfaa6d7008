"""One replica of an inference pool (:mod:`polar_cli.proxy.pool`), and a model call in flight on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from polar_cli.interfaces.backend import BackendClient
from polar_cli.models.chat import Generation, UpstreamStream
from polar_cli.models.inference import ReplicaRole, ReplicaState, ReplicaStatus, VersionSpan


@dataclass(eq=False)
class Flight:
    """One call in flight on a replica: the versions its tokens were sampled under, as they changed."""

    replica: Replica
    session_id: str
    version: int
    streamed: bool = False
    tokens: int = 0
    boundaries: list[tuple[int | None, int]] = field(default_factory=list)
    interrupt: asyncio.Event | None = None
    """A token-mode call: set to stop it where it is (an abort-mode pause)."""

    def __post_init__(self) -> None:
        self.boundaries.append((0, self.version))

    def crossed(self, version: int) -> None:
        if version != self.boundaries[-1][1]:
            self.boundaries.append((self.tokens if self.streamed else None, version))

    def stamp(self, generation: Generation) -> None:
        generation.policy_version = self.version
        generation.replica = self.replica.url
        if len(self.boundaries) > 1:
            generation.version_spans = [VersionSpan(start=start, version=v) for start, v in self.boundaries]
        if generation.logprobs_mode is None:
            generation.logprobs_mode = self.replica.client.logprobs_mode


@dataclass(eq=False)
class Replica:
    url: str | None
    client: BackendClient
    version: int
    """The policy version of the weights it serves."""
    role: ReplicaRole = "current"
    state: ReplicaState = "healthy"
    calls: int = 0
    errors: int = 0
    last_error: str | None = None
    flights: set[Flight] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)
    held: bool = False
    """A stale replica that skipped the last load: version changes pass it by until it takes a load."""
    frozen: bool = False
    """Its server holds our calls with a keep-mode pause (to undo on resume)."""
    chosen_at: int = 0
    """When it was last given a new session (the pool's count of sessions placed): ties go to the longest unchosen,
    so sessions that arrive one at a time still spread over the replicas."""

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(url=self.url or "(in process)", state=self.state, in_flight=len(self.flights),
                             calls=self.calls, errors=self.errors, last_error=self.last_error,
                             sessions=len(self.sessions), role=self.role, policy_version=self.version)  # fmt: skip

    def where(self) -> str:
        return self.url or self.client.name or type(self.client).__name__


class PooledStream:
    """A replica's upstream stream, counted as in flight until it ends; it counts the token ids it relays so that a
    version change mid-stream is placed exactly."""

    def __init__(self, land: Callable[[Flight], None], flight: Flight, inner: UpstreamStream) -> None:
        self._land = land
        self.flight = flight
        self._inner = inner

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async for chunk in self._inner.chunks():
                choices = chunk.get("choices")
                if choices and isinstance(choices, list) and isinstance(choices[0], dict):
                    ids = choices[0].get("token_ids")
                    if isinstance(ids, list):
                        self.flight.tokens += len(ids)
                yield chunk
        finally:
            self._land(self.flight)

    def abort(self) -> None:
        self._inner.abort()
        self._land(self.flight)

    def stamp(self, generation: Generation) -> None:
        """Put the call's version, version spans and replica on the generation the stream was assembled into."""
        self.flight.stamp(generation)
