"""The inference pool as the rest of Polar sees it: pause modes, replica and pool status, policy-version spans.

A gateway's proxy sends model calls to a pool of inference servers (replicas). The rollout server tells every gateway
to pause, resume under a new ``policy_version``, load weights, and add or remove replicas; each journaled
Completion records the version it was sampled under (docs/service.md, "Weight updates").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, NonNegativeInt

PauseMode = Literal["wait", "keep", "abort"]
"""``wait``: no new model call reaches a replica, calls in flight finish, the pause returns when the pool is quiet.
``keep``: calls in flight are frozen on their replica (the server's own keep-mode pause) and finish under the new
weights after the resume. ``abort``: token-mode calls in flight are stopped where they are and keep what they
sampled; after the resume each goes on from its prompt + those ids under the new policy and reaches its harness as one
answer, with exact ``version_spans`` (partial rollouts); other calls in flight finish, as in ``wait``."""

ReplicaState = Literal["healthy", "unhealthy", "draining"]
"""``healthy``: in rotation. ``unhealthy``: a call failed to reach it; out of rotation until a health check answers.
``draining``: being removed; its calls in flight finish, no new call goes to it."""

ReplicaRole = Literal["current", "stale"]
"""``current``: takes every weight update, serves every model call. ``stale``: takes only every
``PoolConfig.stale_period``-th update (so it lags behind), and serves only the calls of tasks that ask for
cross-policy sampling (``agent.sampling.stale_fraction``)."""

LogprobsMode = Literal["raw", "processed"]
"""Which distribution a server's logprobs come from: ``raw`` (the model's, before temperature/top-p/top-k: vLLM's
default ``raw_logprobs``) or ``processed`` (the distribution actually sampled from: ``processed_logprobs``)."""

INITIAL_POLICY_VERSION = 1
MAX_POLICY_VERSION = 2**53
"""Versions are whole numbers in 0..2**53: every JSON reader (and the journal's 64-bit ints) holds them exactly."""
MAX_CONTROL_TIMEOUT_S = 86_400.0
"""The longest a pause, a drain or a weight load may be told to wait (a day)."""
"""The policy version a fresh rollout server (and a gateway not yet told otherwise) samples under."""


def replica_key(url: str) -> str:
    """A replica's identity, as pools list it (``ReplicaStatus.url``): the URL without a trailing slash or ``/v1``."""
    base = url.strip().rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def is_remote(url: str) -> bool:
    """Whether a replica is an inference server reached over HTTP (and may be shared by gateways), not one inside the
    gateway's own process (the scripted backend's)."""
    return url.startswith(("http://", "https://"))


class VersionSpan(BaseModel):
    """From response token ``start`` on (0-based index into ``response_ids``), tokens were sampled under
    ``version``. A call that crossed a weight update has two or more spans, in order. ``start`` is None where nobody
    could tell where the update fell: a non-streamed call frozen by a keep-mode pause (its tokens come from these
    versions, the boundary is unknown); a streamed call's boundaries are exact (Polar counts the tokens it relayed)."""

    start: NonNegativeInt | None
    version: int


class ReplicaStatus(BaseModel):
    """One inference server of a gateway's pool."""

    url: str
    state: ReplicaState
    in_flight: NonNegativeInt = 0
    calls: NonNegativeInt = Field(default=0, description="calls it answered")
    errors: NonNegativeInt = Field(default=0, description="calls that failed on it (retried elsewhere if possible)")
    last_error: str | None = None
    sessions: NonNegativeInt = Field(default=0, description="sessions pinned to it (session affinity)")
    role: ReplicaRole = "current"
    policy_version: int | None = Field(
        default=None, description="the policy version of the weights it serves (a stale replica's lags behind)"
    )


class PoolStatus(BaseModel):
    """One gateway's pool: the version it samples under, whether it is paused, and its replicas."""

    policy_version: int
    paused: PauseMode | None = None
    waiting: NonNegativeInt = Field(default=0, description="model calls held at the proxy by a pause")
    in_flight: NonNegativeInt = 0
    replicas: list[ReplicaStatus] = Field(default_factory=list)
