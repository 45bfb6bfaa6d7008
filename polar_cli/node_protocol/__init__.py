"""The node protocol: everything the rollout server and its gateways say to each other, typed, with one client for
each direction. ``polar_cli.server`` and ``polar_cli.gateway`` both import it; neither imports the other.

| direction | route (on the receiver) | body → answer (``messages``) |
|---|---|---|
| server → gateway | ``POST /sessions/batch`` | ``SessionBatch`` → ``SessionBatchAnswer`` |
| server → gateway | ``POST /sessions`` | ``SingleSession`` → ``SessionCreated`` (gateways without the batch route) |
| server → gateway | ``GET /sessions/{id}`` | → ``SessionInfo`` (the look-up) |
| server → gateway | ``DELETE /sessions/{id}`` | → ``SessionResult`` (cancel) |
| server → gateway | ``GET /inference`` | → ``PoolStatus`` (``polar_cli.models.inference``) |
| server → gateway | ``POST /inference/pause`` | ``PauseBody`` → ``PoolStatus`` |
| server → gateway | ``POST /inference/resume`` | ``ResumeBody`` → ``PoolStatus`` |
| server → gateway | ``POST /inference/load_weights`` | ``LoadWeightsBody`` → ``PoolStatus`` |
| server → gateway | ``POST`` / ``DELETE /inference/backends`` | ``BackendBody`` → ``PoolStatus`` (add / remove) |
| server → gateway | ``POST /inference/cancel_stale`` | ``CancelStaleBody`` → ``CancelStaleAnswer`` |
| gateway → server | ``POST /nodes/register`` | ``RegisterBody`` → ``RegisterAnswer`` |
| gateway → server | ``POST /nodes/{node_id}/heartbeat`` | ``HeartbeatBody`` → ``HeartbeatAnswer`` |
| gateway → server | ``POST /callbacks/session_result`` | ``SessionResultBody`` → ``SessionResultAnswer`` |

``GatewayClient`` (``to_gateway``) is the server's side, ``ServerClient`` (``to_server``) the gateway's; both answer
a ``Reply`` (``wire``): the status, the parsed answer, the error message. The routes themselves live in
``polar_cli.gateway.app`` and ``polar_cli.server.app``.
"""

from polar_cli.node_protocol.messages import (
    ATTEMPT_KEY,
    PAUSE_TIMEOUT_S,
    BackendBody,
    BatchSession,
    BatchSessionAnswer,
    CancelStaleAnswer,
    CancelStaleBody,
    HeartbeatAnswer,
    HeartbeatBody,
    LoadWeightsBody,
    NodeCapacity,
    NodeLoadReport,
    PauseBody,
    RegisterAnswer,
    RegisterBody,
    ResumeBody,
    SessionBatch,
    SessionBatchAnswer,
    SessionCreated,
    SessionInfo,
    SessionResultAnswer,
    SessionResultBody,
    SingleSession,
)
from polar_cli.node_protocol.to_gateway import GatewayClient, NodeAddress
from polar_cli.node_protocol.to_server import ServerClient
from polar_cli.node_protocol.wire import Reply

__all__ = [
    "ATTEMPT_KEY",
    "PAUSE_TIMEOUT_S",
    "BackendBody",
    "BatchSession",
    "BatchSessionAnswer",
    "CancelStaleAnswer",
    "CancelStaleBody",
    "GatewayClient",
    "HeartbeatAnswer",
    "HeartbeatBody",
    "LoadWeightsBody",
    "NodeAddress",
    "NodeCapacity",
    "NodeLoadReport",
    "PauseBody",
    "RegisterAnswer",
    "RegisterBody",
    "Reply",
    "ResumeBody",
    "ServerClient",
    "SessionBatch",
    "SessionBatchAnswer",
    "SessionCreated",
    "SessionInfo",
    "SessionResultAnswer",
    "SessionResultBody",
    "SingleSession",
]
