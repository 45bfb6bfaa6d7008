"""The rollout server's lifecycle: the store, the node registry, the dispatcher, liveness and reconciliation.

The HTTP routes (``polar_cli.server.app``) call the methods here; nothing here knows about requests. Background work:

- the dispatcher sends pending sessions to nodes (``spread``), recording each attempt *before* the call; it runs
  whenever capacity may have freed up (a submission, a result, a requeue, a heartbeat), so a freed slot is refilled in
  the next round rather than at the node's next heartbeat;
- liveness: a node silent for ``dead_after_intervals`` heartbeats is dead and its unfinished sessions go back to
  pending as a new attempt (or fail once ``max_attempts`` are used);
- reconciliation, at start and on every heartbeat: a session the database says a gateway holds, that the gateway
  does not list (and is not being sent to it right now), is looked up there (``GET /sessions/{id}``): a finished one
  is committed, one the gateway does not know is dispatched again;
- the trainer-callback sender (``polar_cli.server.callbacks``);
- retention (``polar_cli.server.retention_runner``): the data dir measured, and acknowledged tasks compacted or
  removed as configured.

Store calls run on the store threads (``polar_cli.server.store_threads``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, get_args

import httpx

from polar_cli.aio import wait_event
from polar_cli.errors import AuthError, ConfigError, ForbiddenError, PolarError, SessionError, SessionExistsError
from polar_cli.ids import session_ids_for as new_session_ids
from polar_cli.metrics import Exposition, ServerMetrics, ServerReading
from polar_cli.models import NodeLoad, RecentRewards, SessionResult, TaskRequest, TaskStatus
from polar_cli.models.service import (
    TERMINAL_TASK_STATES,
    THROUGHPUT_WINDOWS_S,
    AckAnswer,
    NodeStatus,
    ServiceStatus,
    SubmitAnswer,
    TaskList,
    Throughput,
)
from polar_cli.node_protocol import (
    ATTEMPT_KEY,
    BatchSession,
    GatewayClient,
    HeartbeatAnswer,
    HeartbeatBody,
    RegisterAnswer,
    RegisterBody,
    Reply,
    SessionBatch,
    SessionBatchAnswer,
    SessionCreated,
    SessionResultAnswer,
    SessionResultBody,
)
from polar_cli.rewards import RECENT_TASKS, RecentTasks
from polar_cli.server.callbacks import CallbackSender
from polar_cli.server.config import ServerConfig
from polar_cli.server.disk import SessionFiles
from polar_cli.server.inference import InferenceControl
from polar_cli.server.retention_runner import RetentionRunner
from polar_cli.server.scheduler import NodeView, spread
from polar_cli.server.store import (
    ASSIGNED,
    NodeRow,
    SessionRow,
    SessionState,
    SessionStore,
    SQLiteStore,
    failed_result,
)
from polar_cli.server.store_threads import StoreThreads
from polar_cli.task_check import check_task
from polar_cli.web.auth import bearer_matches, bearer_token, new_token, token_digest

log = logging.getLogger(__name__)
TOKEN_ENV = "POLAR_TOKEN"
DISPATCH_BATCH = 512
SESSIONS_PER_CALL = 256
"""Sessions sent to one gateway in one ``POST /sessions/batch``."""
SENDS_PER_NODE = 2
"""Calls to one gateway under way at once; sessions for it chosen meanwhile wait for the next call (``_send_batch``)."""
SENDS_IN_FLIGHT = 64
"""Calls to gateways under way at once (a batch is one call): a bound on the sockets and bodies in flight (each node
has a connection pool of its own, ``GatewayClient``)."""
LOOKUPS_IN_FLIGHT = 16
TASKS_CACHED = 4096
"""Task bodies kept as JSON for dispatch (a burst of many small tasks is sent interleaved across nodes)."""
PROBE_TIMEOUT_S = 3.0
"""How long a register waits for the old URL of its node id to answer (a live duplicate answers at once; a host that
went down may not answer at all)."""


def session_ids_for(task: TaskRequest) -> list[str]:
    return new_session_ids(task.task_id, task.num_samples)


@dataclass
class NodeLive:
    """What the server knows of a node in memory: when it was last heard from and what it said."""

    last_seen: float
    last_heartbeat: float | None = None
    dead: bool = False
    unreachable: bool = False
    running: int = 0
    queued: int = 0
    draining: bool = False
    """The node said so in its heartbeat (it is stopping); unlike ``DELETE /nodes/{id}`` this is not kept."""


class RolloutServer:
    """``async with RolloutServer(config) as server:`` runs the background work; ``create_app`` serves it."""

    def __init__(
        self, config: ServerConfig, store: SessionStore | None = None, *, session_files: SessionFiles | None = None
    ) -> None:
        """``session_files``: where the gateway embedded beside it keeps each session's files (role ``all``), so
        retention measures and removes them too."""
        self.config = config
        self.store: SessionStore = store or SQLiteStore(config.db_path)
        self.threads = StoreThreads(store=self.store)
        self.token = self._resolve_token()
        self.client = httpx.AsyncClient(timeout=config.dispatch_timeout_s)
        """The trainer callbacks' client; gateways are called through ``gateways``, a pool per node."""
        self.gateways = GatewayClient(timeout=config.dispatch_timeout_s)
        self.callbacks = CallbackSender(self.store, config.callbacks, self.client, self.threads)
        self.inference = InferenceControl(
            self.store, self.threads, self.gateways, self._live_nodes, config.initial_policy_version
        )
        self.retention = RetentionRunner(config.retention, self.store, self.threads, config.db_path, session_files)
        self.metrics = ServerMetrics()
        self.metrics.watch(self._metrics_reading)
        self.callbacks.metrics = self.metrics
        self._live: dict[str, NodeLive] = {}
        self._sampled: deque[tuple[float, int]] = deque()
        """(when, trainable tokens) of each result accepted from a gateway in the last throughput window."""
        self._recent = RecentTasks()
        """The outcomes of the tasks that ended last, for ``ServiceStatus.rewards``."""
        self._nodes: dict[str, NodeRow] = {}
        self._node_tokens: set[bytes] = set()
        """The digests of the registered nodes' tokens (``token_digest``): who may post a result, known before its
        body is read."""
        self._tasks_cache: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()
        self._dispatch_wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._sending: set[str] = set()
        self._no_batch: set[str] = set()
        """Nodes that answered 404/405 to ``POST /sessions/batch`` (older gateways): sessions go one by one."""
        self._looking_up: set[str] = set()
        self._send_limit = asyncio.Semaphore(SENDS_IN_FLIGHT)
        self._outbox: dict[str, list[tuple[SessionRow, int]]] = {}
        """Sessions chosen for a node, recorded, waiting for its next ``POST /sessions/batch``."""
        self._senders: dict[str, int] = {}
        self._lookup_limit = asyncio.Semaphore(LOOKUPS_IN_FLIGHT)
        self._dispatching = True
        self._stopping = False
        self._loops: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()

    def _resolve_token(self) -> str:
        """``config.token``, else ``$POLAR_TOKEN``, else the one generated on this data dir's first start."""
        token = self.config.token or os.environ.get(TOKEN_ENV) or self.store.meta("token")
        if not token:
            token = new_token()
            self.store.set_meta("token", token)
        return token

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        now = time.monotonic()
        for node in await self.threads.read(self.store.nodes):
            self._nodes[node.node_id] = node
            self._live[node.node_id] = NodeLive(last_seen=now)  # a grace period: a full dead-after span to heartbeat
        self._node_tokens = {token_digest(node.token) for node in self._nodes.values()}
        if self.retention.config.enabled:  # what is due goes before anything is served; then every interval_s
            await self.retention.pass_logged()  # (without retention the first measurement runs in the background)
        self._loops = [
            asyncio.create_task(self._dispatch_loop(), name="polar-dispatch"),
            asyncio.create_task(self._liveness_loop(), name="polar-liveness"),
            asyncio.create_task(self.callbacks.run(), name="polar-callbacks"),
            asyncio.create_task(self.retention.run(), name="polar-retention"),
        ]
        self._spawn(self._reconcile())

    def stop_dispatching(self) -> None:
        """No session is sent to any node from now on (a draining shutdown); everything else goes on."""
        self._dispatching = False

    def stop_waiting(self) -> None:
        """The server is shutting down: every long poll answers now (its caller polls again, or is gone), so the
        HTTP server's graceful stop does not wait out their ``wait`` seconds."""
        self._stopping = True
        self._changed.set()  # only the long polls: waking the loops now could race their cancellation below

    async def close(self) -> None:
        self.stop_waiting()
        for task in [*self._loops, *self._background]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._background, return_exceptions=True)
        self._loops.clear()
        await self.client.aclose()
        await self.gateways.aclose()
        await asyncio.to_thread(self.threads.close)
        self.store.close()

    async def __aenter__(self) -> RolloutServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _notify(self) -> None:
        """Something finished: wake long polls, the callback sender and the dispatcher."""
        self._changed.set()
        self._changed = asyncio.Event()
        self.callbacks.wake()
        self._dispatch_wake.set()

    # ---- tasks (trainer API) ------------------------------------------------------------------------------------

    async def submit(self, task: TaskRequest) -> SubmitAnswer:
        check_task(task)  # ConfigError / UnknownComponentError: 400 before anything is stored
        submitted = await self.threads.write(self.store.submit, task, session_ids_for(task))
        if submitted.created:
            self.metrics.tasks_submitted.inc()
            body: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            body.set_result(task.model_dump(mode="json"))
            self._cache_task_body(submitted.task_id, body)
            self._dispatch_wake.set()
        return SubmitAnswer(task_id=submitted.task_id, status=submitted.state, created=submitted.created)

    async def status(self, task_id: str, wait: float = 0.0) -> TaskStatus:
        """The TaskStatus; with ``wait``, once the task has ended or ``wait`` seconds have passed."""
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            changed = self._changed  # taken before the read: a change after it still wakes this wait
            state = await self.threads.read(self.store.task_state, task_id)
            remaining = deadline - time.monotonic()
            if state in TERMINAL_TASK_STATES or remaining <= 0 or self._stopping:
                break
            await wait_event(changed, remaining)
        return await self.threads.read(self.store.task_status, task_id)

    async def task_request(self, task_id: str) -> TaskRequest:
        """The task as it was submitted (SessionError for an unknown one)."""
        return await self.threads.read(self.store.task, task_id)

    async def ended_tasks(self, since: float) -> TaskList:
        return TaskList(since=since, task_ids=await self.threads.read(self.store.ended_tasks, since))

    async def ack(self, task_id: str) -> AckAnswer:
        """The trainer has what it needs of the ended task: retention may compact or remove it."""
        return AckAnswer(task_id=task_id, acked_at=await self.threads.write(self.store.ack_task, task_id))

    async def cancel(self, task_id: str) -> TaskStatus:
        for row in await self.threads.write(self.store.cancel_task, task_id):
            if row.node_id is not None:
                self._spawn(self._cancel_on_node(row.node_id, row.session_id))
        self._notify()
        return await self.threads.read(self.store.task_status, task_id)

    def overview(self) -> ServiceStatus:
        """``GET /rollout/status`` (blocking: the app awaits :meth:`service_status`, which runs this off the loop)."""
        views = self._views(self.store.nodes(), self.store.assigned_counts())
        now = time.time()
        nodes = []
        for node, view in views:
            live = self._live.get(node.node_id)
            heard = live.last_heartbeat if live else None
            age = None if heard is None else round(max(0.0, now - heard), 3)
            load = NodeLoad(run_slots=view.run_slots, assigned=view.assigned, running=view.running, queued=view.queued)
            nodes.append(NodeStatus(node_id=node.node_id, url=node.url, healthy=view.healthy, draining=view.draining,
                                    load=load, last_heartbeat=heard, heartbeat_age_s=age,
                                    placement=node.placement))  # fmt: skip
        sessions = self.store.session_counts()
        return ServiceStatus(
            tasks=self.store.task_counts(),
            nodes=nodes,
            pending_sessions=sessions.get("pending", 0),
            pending_callbacks=self.store.pending_callbacks(),
            sessions=sessions,
            throughput=self._throughput(now),
            server_time=now,
            rewards=self._recent_rewards(),
            disk=self.retention.usage,
            retention=self.retention.status(),
        )

    def _recent_rewards(self) -> RecentRewards:
        """The reward statistics of the last tasks that ended (each task's results are read once: they are final)."""
        task_ids = self.store.last_ended_tasks(RECENT_TASKS)
        for task_id in task_ids:
            if not self._recent.known(task_id):
                status = self.store.task_status(task_id)
                self._recent.add(task_id, status.harness, status.results)
        return self._recent.report(task_ids[::-1])

    def _throughput(self, now: float) -> list[Throughput]:
        finished = self.store.finished_since([now - window for window in THROUGHPUT_WINDOWS_S])
        sampled = list(self._sampled)  # appended to on the event loop: a copy, not the live deque
        out = []
        for window, count in zip(THROUGHPUT_WINDOWS_S, finished, strict=True):
            tokens = sum(n for at, n in sampled if at >= now - window)
            out.append(Throughput(window_s=window, finished=count, per_minute=round(count * 60 / window, 2),
                                  sampled_tokens=tokens))  # fmt: skip
        return out

    def _count_sampled(self, result: SessionResult) -> None:
        now = time.time()
        self._sampled.append((now, sum(trace.trainable_tokens for trace in result.trajectory.traces)))
        while self._sampled and self._sampled[0][0] < now - max(THROUGHPUT_WINDOWS_S):
            self._sampled.popleft()

    async def service_status(self) -> ServiceStatus:
        return await self.threads.read(self.overview)

    @property
    def exposition(self) -> Exposition:
        """What ``GET /metrics`` renders (the database's counts are read off the event loop first)."""
        return Exposition(self.metrics.registry, self.metrics.refresh)

    async def _metrics_reading(self) -> ServerReading:
        sessions, tasks, pending_callbacks = await self.threads.read(self._counts)
        nodes = [(view.healthy, view.draining) for _, view in self._views(self._nodes.values(), {})]
        return ServerReading(sessions=sessions, tasks=tasks, pending_callbacks=pending_callbacks, nodes=nodes,
                             policy_version=self.inference.policy_version,
                             paused=self.inference.paused is not None)  # fmt: skip

    def _counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        """Sessions by state, tasks by state, callbacks pending (blocking: a store thread runs it)."""
        sessions = {state: self.store.count_sessions(state) for state in get_args(SessionState)}
        tasks: dict[str, int] = {str(state): n for state, n in self.store.task_counts().items()}
        return sessions, tasks, self.store.pending_callbacks()

    async def _task_body(self, task_id: str) -> dict[str, Any]:
        """The task as JSON (cached, filled at submit: one task's sessions go to many nodes at once, and each batch
        waits on the one read of a task the cache lost rather than reading it again)."""
        entry = self._tasks_cache.get(task_id)
        if entry is None:
            entry = asyncio.ensure_future(self._read_task_body(task_id))
            self._cache_task_body(task_id, entry)
        try:
            return await asyncio.shield(entry)
        except PolarError:
            if self._tasks_cache.get(task_id) is entry:
                del self._tasks_cache[task_id]  # an unknown task is not remembered
            raise

    async def _read_task_body(self, task_id: str) -> dict[str, Any]:
        task = await self.threads.read(self.store.task, task_id)
        return task.model_dump(mode="json")

    def _cache_task_body(self, task_id: str, body: asyncio.Future[dict[str, Any]]) -> None:
        self._tasks_cache[task_id] = body
        while len(self._tasks_cache) > TASKS_CACHED:
            self._tasks_cache.popitem(last=False)

    # ---- nodes (gateway API) ------------------------------------------------------------------------------------

    def check_some_node(self, request: Any) -> None:
        """AuthError unless ``request`` carries the token of some registered node: what a route whose body names the
        node (``POST /callbacks/session_result``) checks before reading that body; :meth:`check_node` after."""
        presented = bearer_token(request)
        if presented is None:
            raise AuthError("node calls need the calling node's node token (Authorization: Bearer <node token>)")
        if token_digest(presented) not in self._node_tokens:
            raise AuthError("wrong node token: it is not the token of any registered node")

    def check_node(self, node_id: str, request: Any) -> None:
        """AuthError unless ``request`` carries the token of registered node ``node_id``."""
        node = self._nodes.get(node_id)
        if bearer_token(request) is None:
            raise AuthError(f"node {node_id!r} calls need that node's node token (Authorization: Bearer <node token>)")
        if node is None or not bearer_matches(request, node.token):
            raise AuthError(f"wrong node token: it is not the token node {node_id!r} registered with")

    async def register(self, body: RegisterBody) -> RegisterAnswer:
        """A gateway (re)starts: whatever the server thought ran there and is not among its held results is lost.
        SessionExistsError (409) when another gateway, alive at another URL, holds the node id."""
        node_id = body.node_id or f"node-{secrets.token_hex(4)}"
        url = body.url.rstrip("/")
        await self._refuse_live_duplicate(node_id, url)
        await self.threads.write(self.store.upsert_node, node_id, url, body.token, body.capacity.run_slots,
                                 body.placement)  # fmt: skip
        node = await self.threads.read(self.store.node, node_id)
        assert node is not None
        before = self._nodes.get(node_id)
        self._nodes[node_id] = node
        if before is not None and before.url != url and all(known.url != before.url for known in self._nodes.values()):
            await self.gateways.forget(before.url)  # its pool's connections went to a gateway that is gone
        self._node_tokens = {token_digest(known.token) for known in self._nodes.values()}
        self._live[node_id] = NodeLive(last_seen=time.monotonic())
        held = set(body.held_results)
        for row in await self.threads.read(self.store.sessions, states=ASSIGNED, node_id=node_id):
            if row.session_id not in held and row.session_id not in self._sending:  # a send under way decides
                await self._requeue(row, f"node {node_id} restarted without the session")
        self._dispatch_wake.set()
        return RegisterAnswer(node_id=node_id, heartbeat_interval_s=self.config.heartbeat_interval_s,
                              policy_version=self.inference.policy_version, paused=self.inference.paused)  # fmt: skip

    async def _refuse_live_duplicate(self, node_id: str, url: str) -> None:
        """A node id registering from a new URL is a restart of that node (after a kill, on another port or host)
        unless the node at its old URL, heard from lately, still answers with its node token: then two gateways
        claim one id (the same ``--node-id`` twice, a copied data dir) and the newcomer is refused."""
        before = self._nodes.get(node_id)
        live = self._live.get(node_id)
        if before is None or before.url == url or live is None or live.dead:
            return
        if time.monotonic() - live.last_seen > self.config.dead_after_s:
            return  # silent for too long: the liveness loop is about to call it dead
        reply = await self.gateways.inference(before, timeout=PROBE_TIMEOUT_S)
        if reply.ok:
            raise SessionExistsError(
                f"node id {node_id!r} is held by a live gateway at {before.url}: give each gateway its own --node-id "
                "and data dir (a copied data dir carries the node id in node.json)"
            )

    async def heartbeat(self, node_id: str, body: HeartbeatBody) -> HeartbeatAnswer:
        """The node's load and the sessions it holds: ones it should not run are cancelled there; ones it should
        hold and does not (nor is being sent) are looked up there."""
        live = self._live.setdefault(node_id, NodeLive(last_seen=time.monotonic()))
        if live.dead:
            log.warning("node %s is heartbeating again", node_id)
        live.last_seen, live.last_heartbeat = time.monotonic(), time.time()
        live.dead = live.unreachable = False
        live.running, live.queued = body.load.running, body.load.queued  # reported in the status, not counted
        live.draining = body.draining
        await self.threads.write(self.store.mark_running, node_id, body.sessions)
        sent_before = time.time() - self._settle_s  # a session sent since may have arrived after the node wrote this
        check = await self.threads.read(self.store.check_held, node_id, body.sessions, sent_before)
        self._look_up_all(row for row in check.missing if row.session_id not in self._sending)
        self._dispatch_wake.set()
        return HeartbeatAnswer(cancel=check.cancel)

    async def drain(self, node_id: str) -> dict[str, Any]:
        await self.threads.write(self.store.set_draining, node_id)
        node = self._nodes.get(node_id)
        if node is not None:
            self._nodes[node_id] = dataclasses.replace(node, draining=True)
        return {"node_id": node_id, "draining": True}

    async def session_result(self, body: SessionResultBody) -> SessionResultAnswer:
        """A gateway reports a result: committed (first one only) before the answer goes back.

        ForbiddenError (403) when that attempt of the session was never sent to that node: nothing changes."""
        if body.result.session_id != body.session_id:
            raise ConfigError(f"the result is for session {body.result.session_id!r}, not {body.session_id!r}")
        return await self._accept(body.session_id, body.node_id, body.attempt, body.result)

    async def _accept(self, session_id: str, node_id: str, attempt: int, result: SessionResult) -> SessionResultAnswer:
        metadata = {**result.metadata, "node_id": node_id, ATTEMPT_KEY: attempt}
        result = result.model_copy(update={"metadata": metadata})
        reported = await self.threads.write(
            self.store.report, session_id, node_id, attempt, result, self.config.max_attempts
        )
        if reported.verdict == "refused":
            raise ForbiddenError(f"session {session_id!r} attempt {attempt} was never sent to node {node_id!r}")
        if reported.verdict == "requeued":
            self.metrics.requeues.inc()
            log.warning("session %s: node %s cancelled attempt %d: %s", session_id, node_id, attempt, result.error)
        elif reported.verdict == "accepted":  # a cancelled result accepted means its attempts ran out: an error
            self.metrics.sessions_finished.labels("error" if result.status == "cancelled" else result.status).inc()
            self._count_sampled(result)
        if reported.verdict != "duplicate":
            self._notify()
        return SessionResultAnswer(duplicate=reported.verdict == "duplicate")

    async def _requeue(self, row: SessionRow, reason: str) -> None:
        outcome = await self.threads.write(
            self.store.requeue, row.session_id, row.attempt, reason, self.config.max_attempts
        )
        if outcome is not None:
            if outcome.accepted:  # its attempts ran out
                self.metrics.sessions_finished.labels("error").inc()
            else:
                self.metrics.requeues.inc()
            log.warning("session %s: %s", row.session_id, reason)
            self._notify()

    def _live_nodes(self) -> list[NodeRow]:
        """The registered nodes not declared dead (draining ones included: their sessions still sample)."""
        return [
            node for node_id, node in self._nodes.items() if not (node_id in self._live and self._live[node_id].dead)
        ]

    @property
    def _settle_s(self) -> float:
        """Two heartbeat intervals: a node that is up has heartbeated within them, and has listed every session that
        reached it before them."""
        return 2 * self.config.heartbeat_interval_s

    def _healthy(self, node_id: str) -> bool:
        live = self._live.get(node_id)
        return live is not None and not live.dead and not live.unreachable

    # ---- dispatch -----------------------------------------------------------------------------------------------

    def _views(self, nodes: Iterable[NodeRow], assigned: dict[str, int]) -> list[tuple[NodeRow, NodeView]]:
        """Each node's row merged with what the server knows of it live: what scheduling and the status both use."""
        out = []
        for node in nodes:
            live = self._live.get(node.node_id)
            view = NodeView(
                node_id=node.node_id,
                run_slots=node.run_slots,
                healthy=self._healthy(node.node_id),
                draining=node.draining or (live is not None and live.draining),
                assigned=assigned.get(node.node_id, 0),
                running=live.running if live else 0,
                queued=live.queued if live else 0,
            )
            out.append((node, view))
        return out

    async def _dispatch_loop(self) -> None:
        while True:
            await wait_event(self._dispatch_wake, self.config.heartbeat_interval_s)
            self._dispatch_wake.clear()
            try:
                if self._dispatching:
                    await self._dispatch_pending()
            except Exception:
                log.exception("dispatch failed")

    async def _dispatch_pending(self) -> None:
        """Choose a node for each pending session (until none can take more), record them all, then send them."""
        pending = await self.threads.read(self.store.sessions, states=("pending",), limit=DISPATCH_BATCH)
        if not pending:
            return
        assigned = await self.threads.read(self.store.assigned_counts)
        views = [view for _, view in self._views(self._nodes.values(), assigned)]
        nodes = spread(views, [row.node_id for row in pending], max_queued=self.config.max_queued_per_node)
        chosen = [(row, node.node_id) for row, node in zip(pending, nodes, strict=False)]
        if not chosen:
            return
        self._sending.update(row.session_id for row, _ in chosen)  # before they are recorded: see heartbeat()
        attempts = await self.threads.write(
            self.store.dispatch_many, [(row.session_id, node_id) for row, node_id in chosen]
        )
        batches: dict[str, list[tuple[SessionRow, int]]] = {}
        for (row, node_id), attempt in zip(chosen, attempts, strict=True):
            if attempt is None:
                self._sending.discard(row.session_id)
                continue
            batches.setdefault(node_id, []).append((row, attempt))
            self.metrics.dispatches.inc()
        for node_id, sends in batches.items():
            for start in range(0, len(sends), SESSIONS_PER_CALL):
                self._spawn(self._send_batch(node_id, sends[start : start + SESSIONS_PER_CALL]))
        if len(pending) == DISPATCH_BATCH and len(chosen) == len(pending):
            self._dispatch_wake.set()  # more may be waiting

    async def _send_batch(self, node_id: str, sends: list[tuple[SessionRow, int]]) -> None:
        """POST the sessions to their gateway in one call (``POST /sessions/batch``); each session's answer is then
        handled as a ``POST /sessions`` answer would be. A gateway without the batch route gets them one by one.

        A node with ``SENDS_PER_NODE`` calls under way already gets these in its next call, which takes every session
        queued for it by then (up to ``SESSIONS_PER_CALL``): under a burst of submissions, a few calls of many
        sessions each instead of a call per dispatch round of one or two (each call costs the same, however small)."""
        queue = self._outbox.setdefault(node_id, [])
        queue.extend(sends)
        if self._senders.get(node_id, 0) >= SENDS_PER_NODE:
            return
        self._senders[node_id] = self._senders.get(node_id, 0) + 1
        try:
            while queue:
                batch = queue[:SESSIONS_PER_CALL]
                del queue[:SESSIONS_PER_CALL]
                try:
                    await self._post_and_settle(node_id, batch)
                    await self._requeue_if_dead(node_id, batch)
                except Exception:  # the heartbeats' reconciliation finds out where these got to
                    log.exception("%d sessions: sending them to node %s failed", len(batch), node_id)
        finally:
            self._senders[node_id] -= 1
            if not self._senders[node_id]:
                del self._senders[node_id]
                if not queue and self._outbox.get(node_id) is queue:
                    del self._outbox[node_id]

    async def _requeue_if_dead(self, node_id: str, sends: list[tuple[SessionRow, int]]) -> None:
        """Sessions that reached a node declared dead while they were being sent (liveness leaves sessions under way
        to their send): lost there, as the node's other sessions were. A send that failed left nothing to requeue."""
        live = self._live.get(node_id)
        if live is not None and live.dead:
            for row, attempt in sends:
                await self._requeue(dataclasses.replace(row, attempt=attempt), f"node {node_id} stopped heartbeating")

    async def _post_and_settle(self, node_id: str, sends: list[tuple[SessionRow, int]]) -> None:
        if node_id in self._no_batch:
            await asyncio.gather(*(self._send(row, node_id, attempt) for row, attempt in sends))
            return
        try:
            async with self._send_limit:
                reply = await self._post_batch(node_id, sends)
        finally:
            self._sending.difference_update(row.session_id for row, _ in sends)
        if reply.status is None:
            log.warning("%d sessions: dispatch to %s failed: %s", len(sends), node_id, reply.error)
        if reply.status in (404, 405):  # an older gateway: no batch route
            self._no_batch.add(node_id)
            self._sending.update(row.session_id for row, _ in sends)
            await asyncio.gather(*(self._send(row, node_id, attempt) for row, attempt in sends))
            return
        if reply.status is None or reply.status == 503:
            await self._undo(node_id, sends)
            return
        if not reply.ok:  # the whole batch refused: each session as if refused alone
            for row, attempt in sends:
                await self._settle(row, node_id, attempt, reply.status, reply.error)
            return
        if reply.answer is None:
            log.warning("node %s answered a batch with %s", node_id, reply.error)
        answers = {a.session_id: a for a in reply.answer.sessions} if reply.answer is not None else {}
        undo: list[tuple[SessionRow, int]] = []
        for row, attempt in sends:
            answer = answers.get(row.session_id)
            if answer is None:  # not answered for: the heartbeats' reconciliation finds out whether it got there
                continue
            if answer.status == 503:
                undo.append((row, attempt))
            elif not answer.accepted:
                await self._settle(row, node_id, attempt, answer.status, answer.error or "")
        if undo:
            await self._undo(node_id, undo)

    async def _undo(self, node_id: str, sends: list[tuple[SessionRow, int]]) -> None:
        """Dispatches that did not reach the node (unreachable, or draining): back to pending, not as attempts;
        the node is unreachable until it heartbeats again."""
        if node_id in self._live:
            self._live[node_id].unreachable = True
        await self.threads.write(self.store.undo_dispatch_many, [(row.session_id, attempt) for row, attempt in sends])
        self._dispatch_wake.set()

    async def _post_batch(self, node_id: str, sends: list[tuple[SessionRow, int]]) -> Reply[SessionBatchAnswer]:
        node = self._nodes.get(node_id)
        if node is None:
            return Reply(None, error=f"unknown node {node_id!r}")
        try:
            tasks = {row.task_id: await self._task_body(row.task_id) for row, _ in sends}
        except PolarError as exc:
            return Reply(None, error=str(exc))
        sessions = [BatchSession(task_id=row.task_id, sample_index=row.sample_index, session_id=row.session_id,
                                 attempt=attempt) for row, attempt in sends]  # fmt: skip
        return await self.gateways.create_sessions(node, SessionBatch(tasks=tasks, sessions=sessions))

    async def _send(self, row: SessionRow, node_id: str, attempt: int) -> None:
        """POST one session to its gateway (``POST /sessions``: a gateway without the batch route)."""
        try:
            async with self._send_limit:
                reply = await self._post_session(row, node_id, attempt)
        finally:
            self._sending.discard(row.session_id)
        if reply.status is None:
            log.warning("session %s: dispatch to %s failed: %s", row.session_id, node_id, reply.error)
        if reply.status is None or reply.status == 503:
            await self._undo(node_id, [(row, attempt)])
        elif not reply.ok:
            await self._settle(row, node_id, attempt, reply.status, reply.error)
        await self._requeue_if_dead(node_id, [(row, attempt)])

    async def _settle(self, row: SessionRow, node_id: str, attempt: int, status: int, message: str) -> None:
        """A session the node refused: a 4xx (the gateway cannot run the task) fails it; anything else (401, 404,
        409, 5xx) sends it again as a new attempt."""
        if 400 <= status < 500 and status not in (401, 404, 409):
            error = f"node {node_id} refused the session: {message}"
            failed = failed_result(row.task_id, row.session_id, row.sample_index, "error", error)
            finished = await self.threads.write(self.store.finish, row.session_id, failed)
            if finished.accepted:
                self.metrics.sessions_finished.labels("error").inc()
            self._notify()
            return
        log.warning("session %s: node %s answered %s: %s", row.session_id, node_id, status, message)
        current = await self.threads.read(self.store.session, row.session_id)
        await self._requeue(current, f"node {node_id} answered {status}")

    async def _post_session(self, row: SessionRow, node_id: str, attempt: int) -> Reply[SessionCreated]:
        node = self._nodes.get(node_id)
        if node is None:
            return Reply(None, error=f"unknown node {node_id!r}")
        try:
            task = await self._task_body(row.task_id)
        except PolarError as exc:
            return Reply(None, error=str(exc))
        return await self.gateways.create_session(node, task, row.sample_index, row.session_id, attempt)

    async def _cancel_on_node(self, node_id: str, session_id: str) -> None:
        node = self._nodes.get(node_id)
        if node is not None:
            await self.gateways.cancel(node, session_id)  # a node that does not answer: liveness decides

    # ---- liveness and reconciliation ----------------------------------------------------------------------------

    async def _liveness_loop(self) -> None:
        period = self.config.heartbeat_interval_s / 2
        checked = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            stalled = now - checked - period
            checked = now
            if stalled > period:
                # This process could not run (its event loop blocked, or the process paused): heartbeats that came
                # meanwhile wait unread in their sockets. The nodes are not to blame for that time.
                for live in self._live.values():
                    live.last_seen += stalled
            for node_id, live in list(self._live.items()):
                if live.dead or now - live.last_seen <= self.config.dead_after_s:
                    continue
                live.dead = True
                log.warning("node %s missed its heartbeats: re-dispatching its sessions", node_id)
                for row in await self.threads.read(self.store.sessions, states=ASSIGNED, node_id=node_id):
                    if row.session_id not in self._sending:  # a send under way decides (a failed one: not an attempt)
                        await self._requeue(row, f"node {node_id} stopped heartbeating")

    async def _reconcile(self) -> None:
        """At start: the sessions the database says a gateway holds are checked against what it holds (the server
        may have died mid-dispatch, or while the gateway finished it). A node's first heartbeat lists what it holds,
        and the rest is looked up (:meth:`heartbeat`), so 100,000 sessions in flight cost a heartbeat per node, not
        100,000 look-ups; the sessions of a node that has not heartbeated within ``_settle_s`` are looked up there
        one by one (a node that answers neither is declared dead by liveness, and its sessions dispatched again)."""
        await asyncio.sleep(self._settle_s)
        for node_id, live in list(self._live.items()):
            if live.last_heartbeat is None:
                self._look_up_all(await self.threads.read(self.store.sessions, states=ASSIGNED, node_id=node_id))

    def _look_up_all(self, rows: Iterable[SessionRow]) -> None:
        for row in rows:
            if row.session_id not in self._looking_up:
                self._looking_up.add(row.session_id)
                self._spawn(self._look_up(row))

    async def _look_up(self, row: SessionRow) -> None:
        """Ask the session's gateway about it: a result there is committed; a gateway that does not know it lost it."""
        try:
            node = self._nodes.get(row.node_id or "")
            if node is None:
                await self._requeue(row, "its node is unknown")
                return
            async with self._lookup_limit:
                reply = await self.gateways.look_up(node, row.session_id)
            if reply.status is None:
                return  # liveness decides about a node that does not answer
            if reply.status == 404:
                await self._requeue(row, f"node {node.node_id} does not know the session")
            elif reply.ok and reply.answer is None:
                log.warning("session %s: node %s answered the look-up with %s", row.session_id, node.node_id,
                            reply.error)  # fmt: skip
            elif reply.answer is not None and reply.answer.result is not None:
                result = reply.answer.result
                attempt = result.metadata.get(ATTEMPT_KEY, row.attempt)
                with contextlib.suppress(ForbiddenError, SessionError):
                    await self._accept(row.session_id, node.node_id, int(attempt), result)
        except Exception:
            log.exception("session %s: looking it up on node %s failed", row.session_id, row.node_id)
        finally:
            self._looking_up.discard(row.session_id)
