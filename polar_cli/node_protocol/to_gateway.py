"""``GatewayClient``: the rollout server's one client of its gateways (server → gateway)."""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import httpx
from pydantic import BaseModel

from polar_cli.models.inference import PoolStatus
from polar_cli.models.session import SessionResult
from polar_cli.models.task import TaskRequest
from polar_cli.node_protocol.messages import (
    ATTEMPT_KEY,
    BackendBody,
    CancelStaleAnswer,
    CancelStaleBody,
    LoadWeightsBody,
    PauseBody,
    ResumeBody,
    SessionBatch,
    SessionBatchAnswer,
    SessionCreated,
    SessionInfo,
    SingleSession,
)
from polar_cli.node_protocol.wire import A, Reply, call

CONTROL_MARGIN_S = 15.0
"""Added to the ``timeout_s`` of a control body to bound its call: the gateway answers once that time has passed
(its own refusal, naming what it waited for, is worth more than the server giving up first)."""


class NodeAddress(Protocol):
    """Where a registered node is and the token its routes need (the server's node rows have both)."""

    @property
    def url(self) -> str: ...

    @property
    def token(self) -> str: ...


class GatewayClient:
    """Calls a node's routes, each over that node's own kept-alive connections; each call answers a Reply.

    One connection pool per node rather than one for every node: an HTTP client's pool does bookkeeping over all its
    connections on each request (httpcore checks each one's expiry, and counts the idle ones once per connection), and
    keeps only 20 idle ones alive, so with tens of gateways one shared pool closed and reopened connections under a
    burst and spent most of a dispatch's event-loop time on the pool. A node's pool holds the few calls sent to it at
    once (dispatch sends at most two to a node at a time), whatever the number of nodes."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._tls: ssl.SSLContext | None = None
        """Shared by the pools: building one reads the CA bundle (about 20 ms), once, not once per node."""

    def _client(self, node: NodeAddress) -> httpx.AsyncClient:
        """The pool for ``node``'s URL (a node registering again at another URL gets another)."""
        client = self._clients.get(node.url)
        if client is None:
            if self._tls is None:
                self._tls = httpx.create_ssl_context()
            client = self._clients[node.url] = httpx.AsyncClient(timeout=self.timeout, verify=self._tls)
        return client

    async def forget(self, url: str) -> None:
        """Close the pool for ``url`` (a node registered again elsewhere): a later call there opens a new one."""
        client = self._clients.pop(url, None)
        if client is not None:
            await client.aclose()

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create_sessions(self, node: NodeAddress, batch: SessionBatch) -> Reply[SessionBatchAnswer]:
        """``POST /sessions/batch``."""
        body = batch.model_dump_json().encode()
        url = f"{node.url}/sessions/batch"
        return await call(self._client(node), "POST", url, node.token, SessionBatchAnswer, body=body)

    async def create_session(
        self, node: NodeAddress, task: dict[str, Any], sample_index: int, session_id: str, attempt: int
    ) -> Reply[SessionCreated]:
        """``POST /sessions`` for a gateway without the batch route (older than it): such a gateway reads the attempt
        only from ``task.metadata.polar_attempt`` and refuses fields it does not know, so that is how it is sent."""
        task = {**task, "metadata": {**task["metadata"], ATTEMPT_KEY: attempt}}
        body = SingleSession(task=TaskRequest.model_validate(task), sample_index=sample_index, session_id=session_id)
        return await call(self._client(node), "POST", f"{node.url}/sessions", node.token, SessionCreated,
                          body=body.model_dump_json(exclude_unset=True).encode())  # fmt: skip

    async def cancel(self, node: NodeAddress, session_id: str) -> Reply[SessionResult]:
        """``DELETE /sessions/{id}``: the node cancels the session (its answer is the cancelled result)."""
        return await call(self._client(node), "DELETE", f"{node.url}/sessions/{session_id}", node.token, SessionResult)

    async def look_up(self, node: NodeAddress, session_id: str) -> Reply[SessionInfo]:
        """``GET /sessions/{id}``: where the session is on the node, and its result once it has one."""
        return await call(self._client(node), "GET", f"{node.url}/sessions/{session_id}", node.token, SessionInfo)

    # ---- control: the inference pool -----------------------------------------------------------------------------
    # One method each, sending a model of ``polar_cli.node_protocol.messages`` to its route in
    # ``polar_cli.gateway.app``; calls that wait (pause, load weights, remove) are bounded by the body's
    # ``timeout_s`` plus ``CONTROL_MARGIN_S``, not by the kept-alive client's short default.

    async def inference(self, node: NodeAddress, *, timeout: float | None = None) -> Reply[PoolStatus]:
        """``GET /inference``: the node's pool (also the server's probe of whether a node still answers with its
        token: a cheap read that needs it)."""
        return await call(self._client(node), "GET", f"{node.url}/inference", node.token, PoolStatus, timeout=timeout)

    async def pause(self, node: NodeAddress, body: PauseBody) -> Reply[PoolStatus]:
        """``POST /inference/pause``: answered once the pool is quiet (``wait``) or its calls are frozen (``keep``)."""
        return await self._control("POST", node, "/inference/pause", body, PoolStatus, body.timeout_s)

    async def resume(self, node: NodeAddress, body: ResumeBody) -> Reply[PoolStatus]:
        """``POST /inference/resume`` (the server always sends the version)."""
        return await self._control("POST", node, "/inference/resume", body, PoolStatus)

    async def load_weights(self, node: NodeAddress, body: LoadWeightsBody) -> Reply[PoolStatus]:
        """``POST /inference/load_weights``: bounded by the pause and then the reload, each ``timeout_s``."""
        return await self._control("POST", node, "/inference/load_weights", body, PoolStatus, 2 * body.timeout_s)

    async def add_backend(self, node: NodeAddress, body: BackendBody) -> Reply[PoolStatus]:
        """``POST /inference/backends``."""
        return await self._control("POST", node, "/inference/backends", body, PoolStatus, body.timeout_s)

    async def remove_backend(self, node: NodeAddress, body: BackendBody) -> Reply[PoolStatus]:
        """``DELETE /inference/backends`` (JSON body): the replica drains, then leaves the pool."""
        return await self._control("DELETE", node, "/inference/backends", body, PoolStatus, body.timeout_s)

    async def cancel_stale(self, node: NodeAddress, body: CancelStaleBody) -> Reply[CancelStaleAnswer]:
        """``POST /inference/cancel_stale``: the session ids it cancelled."""
        return await self._control("POST", node, "/inference/cancel_stale", body, CancelStaleAnswer)

    async def _control(
        self, method: str, node: NodeAddress, path: str, body: BaseModel, answer: type[A], waits: float = 0.0
    ) -> Reply[A]:
        timeout = waits + CONTROL_MARGIN_S if waits > 0 else None  # None: the client's own
        return await call(self._client(node), method, f"{node.url}{path}", node.token, answer,
                          body=body.model_dump_json().encode(), timeout=timeout)  # fmt: skip
