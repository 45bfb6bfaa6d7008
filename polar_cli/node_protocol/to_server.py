"""``ServerClient``: a gateway's one client of its rollout server (gateway → server)."""

from __future__ import annotations

import httpx

from polar_cli.node_protocol.messages import (
    HeartbeatAnswer,
    HeartbeatBody,
    RegisterAnswer,
    RegisterBody,
    SessionResultAnswer,
    SessionResultBody,
)
from polar_cli.node_protocol.wire import Reply, call


class ServerClient:
    """``register`` presents the server token; every later call the node's own token. ``await aclose()`` at the end."""

    def __init__(self, url: str, server_token: str, *, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.server_token = server_token
        self.client = httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def register(self, body: RegisterBody) -> Reply[RegisterAnswer]:
        """``POST /nodes/register``: the node (again), its capacity and the results it holds."""
        return await call(self.client, "POST", f"{self.url}/nodes/register", self.server_token, RegisterAnswer,
                          body=body.model_dump_json().encode())  # fmt: skip

    async def heartbeat(self, node_id: str, node_token: str, body: HeartbeatBody) -> Reply[HeartbeatAnswer]:
        """``POST /nodes/{node_id}/heartbeat``: the node's load and the sessions it holds."""
        return await call(self.client, "POST", f"{self.url}/nodes/{node_id}/heartbeat", node_token, HeartbeatAnswer,
                          body=body.model_dump_json().encode())  # fmt: skip

    async def report_result(self, node_token: str, body: SessionResultBody) -> Reply[SessionResultAnswer]:
        """``POST /callbacks/session_result``: one finished session."""
        return await call(self.client, "POST", f"{self.url}/callbacks/session_result", node_token,
                          SessionResultAnswer, body=body.model_dump_json().encode())  # fmt: skip
