"""``GatewayClient``: the rollout server's one client of its gateways (server → gateway)."""

from __future__ import annotations

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
    """Calls a node's routes over ``client`` (the server's one kept-alive HTTP client); each call answers a Reply."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def create_sessions(self, node: NodeAddress, batch: SessionBatch) -> Reply[SessionBatchAnswer]:
        """``POST /sessions/batch``."""
        body = batch.model_dump_json().encode()
        return await call(self.client, "POST", f"{node.url}/sessions/batch", node.token, SessionBatchAnswer, body=body)

    async def create_session(
        self, node: NodeAddress, task: dict[str, Any], sample_index: int, session_id: str, attempt: int
    ) -> Reply[SessionCreated]:
        """``POST /sessions`` for a gateway without the batch route (older than it): such a gateway reads the attempt
        only from ``task.metadata.polar_attempt`` and refuses fields it does not know, so that is how it is sent."""
        task = {**task, "metadata": {**task["metadata"], ATTEMPT_KEY: attempt}}
        body = SingleSession(task=TaskRequest.model_validate(task), sample_index=sample_index, session_id=session_id)
        return await call(self.client, "POST", f"{node.url}/sessions", node.token, SessionCreated,
                          body=body.model_dump_json(exclude_unset=True).encode())  # fmt: skip

    async def cancel(self, node: NodeAddress, session_id: str) -> Reply[SessionResult]:
        """``DELETE /sessions/{id}``: the node cancels the session (its answer is the cancelled result)."""
        return await call(self.client, "DELETE", f"{node.url}/sessions/{session_id}", node.token, SessionResult)

    async def look_up(self, node: NodeAddress, session_id: str) -> Reply[SessionInfo]:
        """``GET /sessions/{id}``: where the session is on the node, and its result once it has one."""
        return await call(self.client, "GET", f"{node.url}/sessions/{session_id}", node.token, SessionInfo)

    # ---- control: the inference pool -----------------------------------------------------------------------------
    # One method each, sending a model of ``polar_cli.node_protocol.messages`` to its route in
    # ``polar_cli.gateway.app``; calls that wait (pause, load weights, remove) are bounded by the body's
    # ``timeout_s`` plus ``CONTROL_MARGIN_S``, not by the kept-alive client's short default.

    async def inference(self, node: NodeAddress) -> Reply[PoolStatus]:
        """``GET /inference``: the node's pool."""
        return await call(self.client, "GET", f"{node.url}/inference", node.token, PoolStatus)

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
        return await call(self.client, method, f"{node.url}{path}", node.token, answer,
                          body=body.model_dump_json().encode(), timeout=timeout)  # fmt: skip
