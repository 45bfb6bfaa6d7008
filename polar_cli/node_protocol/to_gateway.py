"""``GatewayClient``: the rollout server's one client of its gateways (server → gateway)."""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from polar_cli.models.session import SessionResult
from polar_cli.models.task import TaskRequest
from polar_cli.node_protocol.messages import (
    ATTEMPT_KEY,
    SessionBatch,
    SessionBatchAnswer,
    SessionCreated,
    SessionInfo,
    SingleSession,
)
from polar_cli.node_protocol.wire import Reply, call


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

    # ---- control (issue 20) --------------------------------------------------------------------------------------
    # pause, resume, the policy version and the backend pool: one method each, sending a model of
    # ``polar_cli.node_protocol.messages`` to its route in ``polar_cli.gateway.app``.
