"""A gateway node's side of the rollout service: register with the server, heartbeat, report every result.

Results are already durable in the node's ResultStore when the agent hears of them; the agent keeps retrying each
one (``POST /callbacks/session_result``, with the node's token) until the server acknowledges it, then appends its id
to ``<data_dir>/acked.log``. On start, stored results missing from that log are reported again (the server may have
been down, or this node killed) and listed as ``held_results`` when the node registers. The node id is kept in
``<data_dir>/node.json``, so a restarted gateway is the same node to the server. A gateway with none (its first start)
picks one before it registers, so its runtimes are labelled with it from the first session on.

Each time the node registers (at start, and again when the server has forgotten it), it takes on the inference pool's
state the server answers: its ``policy_version`` and whether sampling is paused (``GatewayNode.sync_inference``).

At start, a server that cannot be reached is retried for ``config.register_timeout_s``; a refusal (a wrong server
token, a node id a live gateway holds) stops the agent at once: ``ready()`` and ``run()`` raise it, one line naming
the server's URL and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_cli.aio import wait_event
from polar_cli.errors import AuthError, ConfigError, PolarError, ServiceUnavailableError, SessionError
from polar_cli.gateway import placement
from polar_cli.gateway.config import AgentConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.ids import is_session_id
from polar_cli.models import SessionResult
from polar_cli.node_protocol import (
    ATTEMPT_KEY,
    HeartbeatBody,
    NodeCapacity,
    NodeLoadReport,
    RegisterAnswer,
    RegisterBody,
    ServerClient,
    SessionResultBody,
)

log = logging.getLogger(__name__)
SERVER_TOKEN_ENV = "POLAR_SERVER_TOKEN"
BATCH = 16


HAND_BACK_S = 10.0
"""After a drain's wait, how long the gateway waits for the server to acknowledge the sessions it handed back."""


@dataclass(frozen=True)
class Drained:
    """What a drain did with the sessions under way when it began."""

    finished: list[str]
    """Finished here within the drain time (results reported unless listed in ``unreported``)."""
    handed_back: list[str]
    """Cancelled here, reported ``cancelled`` (the server runs them again): still under way when the time ran out, or
    their run was cut off by the stop itself (``StagedPipeline.stopping``)."""
    unreported: list[str]
    """Results the server had not acknowledged at the end: kept in the data dir, reported at the next start."""


class _Unauthorized(Exception):
    """The server does not know this node (or its token): register again."""


class GatewayAgent:
    """``agent = GatewayAgent(config, data_dir)``; pass ``agent.on_result`` to the GatewayNode; ``await
    agent.start(node)`` once the node listens; ``await agent.close()`` before closing the node."""

    def __init__(self, config: AgentConfig, data_dir: Path) -> None:
        if not config.server_url:
            raise ConfigError("a gateway needs the server's URL (--server)")
        token = config.server_token or os.environ.get(SERVER_TOKEN_ENV)
        if not token:
            raise ConfigError(f"a gateway needs the server's token (--server-token or ${SERVER_TOKEN_ENV})")
        self.config = config
        self.server_url = config.server_url.rstrip("/")
        self.server_token = token
        self.data_dir = Path(data_dir)
        saved = self._saved().get("node_id")
        self.node_id: str = config.node_id or (saved if is_session_id(saved) else None) or new_node_id()
        self.placement = placement.from_environment()
        """Its host, and its Slurm job and step when a Slurm job started it (sent when it registers)."""
        self.heartbeat_interval = 5.0
        self.registered = asyncio.Event()
        self.draining = False
        self._unacked: dict[str, None] = {}  # insertion-ordered set
        self._wake = asyncio.Event()
        self._node: GatewayNode | None = None
        self._client: ServerClient | None = None
        self._main: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # ---- state kept on disk -------------------------------------------------------------------------------------

    @property
    def _acked_log(self) -> Path:
        return self.data_dir / "acked.log"

    def _saved(self) -> dict[str, Any]:
        try:
            data = json.loads((self.data_dir / "node.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_node_id(self, node_id: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "node.json").write_text(json.dumps({**self._saved(), "node_id": node_id}))

    def _load_unacked(self, node: GatewayNode) -> None:
        try:
            acked = set(self._acked_log.read_text().split())
        except OSError:
            acked = set()
        for session_id in node.store.session_ids():
            if session_id not in acked:
                self._unacked[session_id] = None

    def _ack(self, session_id: str) -> None:
        self._unacked.pop(session_id, None)
        with self._acked_log.open("a") as fh:
            fh.write(session_id + "\n")

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    def on_result(self, result: SessionResult) -> None:
        """The pipeline's result callback: the result is in the ResultStore; report it."""
        self._unacked[result.session_id] = None
        self._wake.set()

    async def start(self, node: GatewayNode) -> None:
        if node.url is None or not node.config.control_token:
            raise ConfigError("the gateway must listen, with a control token, before it registers")
        self._node = node
        self._load_unacked(node)
        self._client = ServerClient(self.server_url, self.server_token, timeout=self.config.retry.timeout_s)
        self._main = asyncio.create_task(self._run(), name="polar-gateway-agent")

    async def close(self) -> None:
        for task in [t for t in (self._main, *self._background) if t is not None]:
            task.cancel()
        await asyncio.gather(*(t for t in (self._main, *self._background) if t is not None), return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def ready(self) -> None:
        """Until the node has registered; raises what stopped the agent first (the server refused this node, or could
        not be reached within ``config.register_timeout_s``)."""
        assert self._main is not None, "start() first"
        registered = asyncio.create_task(self.registered.wait())
        try:
            await asyncio.wait({registered, self._main}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            registered.cancel()
        if self._main.done():
            self._main.result()

    async def run(self) -> None:
        """Until cancelled (the agent goes on); raises what stopped the agent (the server refused this node)."""
        assert self._main is not None, "start() first"
        await asyncio.shield(self._main)

    async def _run(self) -> None:
        await self._register(within=self.config.register_timeout_s)
        loops = [asyncio.create_task(self._deliver_loop()), asyncio.create_task(self._heartbeat_loop())]
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a refusal when registering again
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    # ---- register and heartbeat ---------------------------------------------------------------------------------

    async def _register(self, *, within: float | None = None) -> None:
        """Register (again). A server that cannot be reached, or answers 5xx, is retried with backoff, each failure
        logged: for up to ``within`` seconds (at start; then ServiceUnavailableError), else until it answers. A
        refusal (4xx) raises at once (:func:`refusal`). Every error names the server's URL and the cause."""
        assert self._node is not None and self._client is not None
        node = self._node
        failures = 0
        self.registered.clear()
        clock = asyncio.get_running_loop()
        deadline = None if within is None else clock.time() + within
        while True:
            pipeline = node.pipeline.config
            capacity = NodeCapacity(
                run_slots=pipeline.run_slots,
                init_workers=pipeline.init_workers,
                postrun_workers=pipeline.postrun_workers,
            )
            assert node.url is not None
            body = RegisterBody(url=node.url, token=node.config.control_token, node_id=self.node_id, capacity=capacity,
                                held_results=list(self._unacked), placement=self.placement)  # fmt: skip
            reply = await self._client.register(body)
            if reply.answer is not None:
                answer: RegisterAnswer = reply.answer
                break
            if reply.status is not None and 400 <= reply.status < 500:
                raise refusal(self.server_url, reply.status, reply.error)
            failures += 1
            cause = reply.error or f"it answered {reply.status}"
            if deadline is not None and clock.time() >= deadline:
                raise ServiceUnavailableError(f"cannot register with the rollout server at {self.server_url}: {cause} "
                                              f"(retried for {within:g} s)")  # fmt: skip
            left = " until it answers" if deadline is None else f" for up to {within:g} s"
            level = logging.WARNING if failures == 1 else logging.INFO  # said once, not at every retry
            log.log(level, "cannot register with the rollout server at %s: %s; retrying%s", self.server_url, cause,
                    left)  # fmt: skip
            pause = self.config.retry.delay(failures)
            await asyncio.sleep(pause if deadline is None else max(0.0, min(pause, deadline - clock.time())))
        self.node_id = node.node_id = answer.node_id
        self.heartbeat_interval = answer.heartbeat_interval_s
        self._save_node_id(answer.node_id)
        if answer.policy_version is not None:  # None: a server older than the inference pool
            try:
                await node.sync_inference(answer.policy_version, answer.paused)
            except PolarError as exc:
                log.error("could not take on the server's inference state: %s", exc)
        self.registered.set()
        self._wake.set()

    def _load(self) -> NodeLoadReport:
        assert self._node is not None
        stages = self._node.pipeline.metrics()["stages"]
        running = stages["running"]["in_flight"]
        queued = (
            stages["init"]["queued"]
            + stages["init"]["in_flight"]
            + stages["ready"]["queued"]
            + stages["ready"]["blocked"]
        )
        slots = stages["running"]["capacity"]
        return NodeLoadReport(run_slots=slots, running=running, queued=queued, free_slots=max(0, slots - running))

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        assert self._node is not None and self._client is not None
        body = HeartbeatBody(
            load=self._load(),
            sessions=[job.session_id for job in self._node.pipeline.active()],
            draining=self.draining,
        )
        reply = await self._client.heartbeat(self.node_id, self._node.config.control_token, body)
        if reply.status == 401:
            await self._register()  # the server forgot this node (a new database)
            return
        if reply.answer is None:
            log.info("heartbeat to %s failed: %s", self.server_url, reply.error or reply.status)
            return
        for session_id in reply.answer.cancel:
            self._spawn(self._cancel(session_id))

    async def drain(self, timeout: float) -> Drained:
        """Stop taking sessions (the node answers 503, the server hears it at once), then wait up to ``timeout``
        seconds for the sessions under way to finish and their results to be acknowledged. Those still under way are
        then handed back: cancelled here, and their ``cancelled`` results reported (the server runs them again
        elsewhere), waiting up to ``HAND_BACK_S`` for the server to acknowledge them."""
        assert self._node is not None
        self._node.draining = self.draining = True
        if self.registered.is_set():
            await self._heartbeat()
        clock = asyncio.get_running_loop()
        under_way = {job.session_id for job in self._node.pipeline.active()}
        await self._settle(clock.time() + timeout)
        left = sorted(job.session_id for job in self._node.pipeline.active())
        if left:
            await asyncio.gather(
                *(self._cancel(sid, "the gateway is stopping (its drain time ran out)") for sid in left)
            )
            await self._settle(clock.time() + HAND_BACK_S)
        back = sorted(sid for sid in under_way if self._status(sid) == "cancelled")
        return Drained(finished=sorted(under_way - set(back)), handed_back=back, unreported=sorted(self._unacked))

    def _status(self, session_id: str) -> str | None:
        assert self._node is not None
        try:
            result = self._node.pipeline.get(session_id).result
        except SessionError:
            return None
        return None if result is None else result.status

    async def _settle(self, deadline: float) -> None:
        """Until nothing is under way and every result is acknowledged, or ``deadline`` (the loop's clock)."""
        assert self._node is not None
        clock = asyncio.get_running_loop()
        while (self._node.pipeline.active() or self._unacked) and clock.time() < deadline:
            self._wake.set()
            await asyncio.sleep(0.1)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel(self, session_id: str, reason: str = "cancelled by the rollout server") -> None:
        assert self._node is not None
        with contextlib.suppress(SessionError):
            await self._node.pipeline.cancel(session_id, reason)

    # ---- result callbacks ---------------------------------------------------------------------------------------

    async def _deliver_loop(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            batch = list(self._unacked)[:BATCH]
            if not batch:
                await self._wake.wait()
                continue
            outcomes = await asyncio.gather(*(self._deliver(sid) for sid in batch), return_exceptions=True)
            if any(o is not True for o in outcomes):
                if any(isinstance(o, _Unauthorized) for o in outcomes):
                    await self._register()
                failures += 1
                await wait_event(self._wake, self.config.retry.delay(failures))
            else:
                failures = 0

    async def _deliver(self, session_id: str) -> bool:
        assert self._node is not None and self._client is not None
        try:
            result = await asyncio.to_thread(self._node.store.read, session_id)
        except SessionError:
            self._unacked.pop(session_id, None)  # nothing stored: nothing to report
            return True
        attempt = result.metadata.get(ATTEMPT_KEY, 1)
        body = SessionResultBody(
            node_id=self.node_id,
            session_id=session_id,
            attempt=attempt if isinstance(attempt, int) and attempt > 0 else 1,
            result=result,
        )
        reply = await self._client.report_result(self._node.config.control_token, body)
        if reply.status is None:
            log.info("result of %s not delivered yet: %s", session_id, reply.error)
            return False
        if reply.status == 401:
            raise _Unauthorized
        if reply.ok or reply.status in (400, 403, 404):
            if not reply.ok:  # the server will never take it (unknown, not ours): do not retry forever
                log.warning("the server refused the result of %s: %s", session_id, reply.error)
            self._ack(session_id)
            return True
        return False


def new_node_id() -> str:
    """A node id for a gateway that has none yet (the rollout server's own form)."""
    return f"node-{secrets.token_hex(4)}"


def refusal(server_url: str, status: int, message: str) -> PolarError:
    """The one-line error of a register the server refused: AuthError for a wrong server token (401/403), ConfigError
    for anything else (409: a live gateway holds this node id)."""
    text = f"the rollout server at {server_url} refused to register this gateway ({status}): {message}"
    if status in (401, 403):
        return AuthError(f"{text} (check --server-token or ${SERVER_TOKEN_ENV})")
    return ConfigError(text)
