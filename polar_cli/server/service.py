"""The rollout server's lifecycle: the store, the node registry, the dispatcher, liveness and reconciliation.

The HTTP routes (``polar_cli.server.app``) call the methods here; nothing here knows about requests. Background work:

- the dispatcher sends pending sessions to nodes (``choose_node``), recording each attempt *before* the call;
- liveness: a node silent for ``dead_after_intervals`` heartbeats is dead and its unfinished sessions go back to
  pending as a new attempt (or fail once ``max_attempts`` are used);
- reconciliation, at start: each session the database says a gateway holds is looked up there (``GET
  /sessions/{id}``): finished ones are committed, ones the gateway never got are dispatched again;
- the trainer-callback sender (``polar_cli.server.callbacks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from polar_cli.errors import AuthError, ConfigError, PolarError, SessionError
from polar_cli.gateway.session_driver import check_task
from polar_cli.http import bearer_matches, new_token
from polar_cli.models import SessionResult, TaskRequest, TaskStatus
from polar_cli.server.callbacks import CallbackSender
from polar_cli.server.config import ServerConfig
from polar_cli.server.models import (
    ATTEMPT_KEY,
    HeartbeatAnswer,
    HeartbeatBody,
    NodeStatus,
    RegisterAnswer,
    RegisterBody,
    ServiceStatus,
    SessionResultAnswer,
    SessionResultBody,
    SubmitAnswer,
)
from polar_cli.server.scheduler import NodeLoad, choose_node
from polar_cli.server.store import ASSIGNED, UNFINISHED, Finished, SessionRow, SessionStore, SQLiteStore, failed_result

log = logging.getLogger(__name__)
TOKEN_ENV = "POLAR_TOKEN"
TERMINAL = ("completed", "failed", "cancelled")


def session_ids_for(task: TaskRequest) -> list[str]:
    from polar_cli.gateway.node import session_id_for

    return [session_id_for(task.task_id, i) for i in range(task.num_samples)]


@dataclass
class NodeLive:
    """What the server knows of a node in memory: when it was last heard from and what it said."""

    last_seen: float
    last_heartbeat: float | None = None
    dead: bool = False
    unreachable: bool = False
    running: int = 0
    queued: int = 0
    reserved: int = 0


class RolloutServer:
    """``async with RolloutServer(config) as server:`` runs the background work; ``create_app`` serves it."""

    def __init__(self, config: ServerConfig, store: SessionStore | None = None) -> None:
        self.config = config
        self.store: SessionStore = store or SQLiteStore(config.db_path)
        self.token = self._resolve_token()
        self.client = httpx.AsyncClient(timeout=config.dispatch_timeout_s)
        self.callbacks = CallbackSender(self.store, config.callbacks, self.client)
        self._live: dict[str, NodeLive] = {}
        self._tasks_cache: OrderedDict[str, TaskRequest] = OrderedDict()
        self._dispatch_wake = asyncio.Event()
        self._changed = asyncio.Condition()
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
        for node in self.store.nodes():  # a grace period: known nodes have a full dead-after span to heartbeat
            self._live[node.node_id] = NodeLive(last_seen=now)
        self._loops = [
            asyncio.create_task(self._dispatch_loop(), name="polar-dispatch"),
            asyncio.create_task(self._liveness_loop(), name="polar-liveness"),
            asyncio.create_task(self.callbacks.run(), name="polar-callbacks"),
        ]
        self._spawn(self._reconcile())

    async def close(self) -> None:
        for task in [*self._loops, *self._background]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._background, return_exceptions=True)
        self._loops.clear()
        await self.client.aclose()
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

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
        self.callbacks.wake()
        self._dispatch_wake.set()

    # ---- tasks (trainer API) ------------------------------------------------------------------------------------

    async def submit(self, task: TaskRequest) -> SubmitAnswer:
        check_task(task)  # ConfigError / UnknownComponentError: 400 before anything is stored
        submitted = self.store.submit(task, session_ids_for(task))
        if submitted.created:
            self._dispatch_wake.set()
        return SubmitAnswer(task_id=submitted.task_id, status=submitted.state)

    async def status(self, task_id: str, wait: float = 0.0) -> TaskStatus:
        """The TaskStatus; with ``wait``, once the task has ended or ``wait`` seconds have passed."""
        deadline = time.monotonic() + max(0.0, wait)
        async with self._changed:
            while True:
                status = self.store.task_status(task_id, with_results=False)
                remaining = deadline - time.monotonic()
                if status.state in TERMINAL or remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        return self.store.task_status(task_id)

    async def cancel(self, task_id: str) -> TaskStatus:
        for row in self.store.cancel_task(task_id):
            if row.node_id is not None:
                self._spawn(self._cancel_on_node(row.node_id, row.session_id))
        await self._notify()
        return self.store.task_status(task_id)

    def overview(self) -> ServiceStatus:
        assigned = self.store.assigned_counts()
        nodes = []
        for node in self.store.nodes():
            live = self._live.get(node.node_id)
            load = {
                "run_slots": node.run_slots,
                "assigned": assigned.get(node.node_id, 0),
                "running": live.running if live else 0,
                "queued": live.queued if live else 0,
            }
            nodes.append(
                NodeStatus(
                    node_id=node.node_id,
                    url=node.url,
                    healthy=self._healthy(node.node_id),
                    draining=node.draining,
                    load=load,
                    last_heartbeat=live.last_heartbeat if live else None,
                )
            )
        pending = len(self.store.sessions(states=("pending",)))
        return ServiceStatus(
            tasks=self.store.task_counts(),
            nodes=nodes,
            pending_sessions=pending,
            pending_callbacks=self.store.pending_callbacks(),
        )

    def _task(self, task_id: str) -> TaskRequest:
        task = self._tasks_cache.get(task_id)
        if task is None:
            task = self._tasks_cache[task_id] = self.store.task(task_id)
            while len(self._tasks_cache) > 256:
                self._tasks_cache.popitem(last=False)
        return task

    # ---- nodes (gateway API) ------------------------------------------------------------------------------------

    def check_node(self, node_id: str, request: Any) -> None:
        """AuthError unless ``request`` carries the token of registered node ``node_id``."""
        node = self.store.node(node_id)
        if node is None or not bearer_matches(request, node.token):
            raise AuthError(f"node {node_id!r} calls need that node's token (Authorization: Bearer <node token>)")

    async def register(self, body: RegisterBody) -> RegisterAnswer:
        """A gateway (re)starts: whatever the server thought ran there and is not among its held results is lost."""
        node_id = body.node_id or f"node-{secrets.token_hex(4)}"
        self.store.upsert_node(node_id, body.url.rstrip("/"), body.token, body.capacity.run_slots)
        self._live[node_id] = NodeLive(last_seen=time.monotonic())
        held = set(body.held_results)
        for row in self.store.sessions(states=ASSIGNED, node_id=node_id):
            if row.session_id not in held:
                await self._requeue(row, f"node {node_id} restarted without the session")
        self._dispatch_wake.set()
        return RegisterAnswer(node_id=node_id, heartbeat_interval_s=self.config.heartbeat_interval_s)

    async def heartbeat(self, node_id: str, body: HeartbeatBody) -> HeartbeatAnswer:
        live = self._live.setdefault(node_id, NodeLive(last_seen=time.monotonic()))
        if live.dead:
            log.warning("node %s is heartbeating again", node_id)
        live.last_seen, live.last_heartbeat = time.monotonic(), time.time()
        live.dead = live.unreachable = False
        live.running, live.queued, live.reserved = body.load.running, body.load.queued, 0
        self.store.mark_running(node_id, body.sessions)
        cancel = []
        for session_id in body.sessions:  # sessions the server gave elsewhere, or already has a result for
            try:
                row = self.store.session(session_id)
            except SessionError:
                cancel.append(session_id)
                continue
            if row.state not in ASSIGNED or row.node_id != node_id:
                cancel.append(session_id)
        self._dispatch_wake.set()
        return HeartbeatAnswer(cancel=cancel)

    async def drain(self, node_id: str) -> dict[str, Any]:
        self.store.set_draining(node_id)
        return {"node_id": node_id, "draining": True}

    async def session_result(self, body: SessionResultBody) -> SessionResultAnswer:
        """A gateway reports a result: committed (first one only) before the answer goes back."""
        if body.result.session_id != body.session_id:
            raise ConfigError(f"the result is for session {body.result.session_id!r}, not {body.session_id!r}")
        return await self._accept(body.session_id, body.node_id, body.attempt, body.result)

    async def _accept(self, session_id: str, node_id: str, attempt: int, result: SessionResult) -> SessionResultAnswer:
        row = self.store.session(session_id)
        current = row.state in ASSIGNED and row.node_id == node_id and row.attempt == attempt
        if row.state not in UNFINISHED:
            return SessionResultAnswer(duplicate=True)
        if result.status == "cancelled":  # the gateway gave up on it (shutting down, told to): not the session's end
            if current:
                await self._requeue(row, f"node {node_id} cancelled it: {result.error or 'no reason given'}")
            return SessionResultAnswer(duplicate=not current)
        metadata = {**result.metadata, "node_id": node_id, ATTEMPT_KEY: attempt}
        finished = self.store.finish(session_id, result.model_copy(update={"metadata": metadata}))
        if finished.accepted and not current and row.state in ASSIGNED and row.node_id is not None:
            self._spawn(self._cancel_on_node(row.node_id, session_id))  # a later attempt still runs somewhere
        if finished.accepted:
            await self._notify()
        return SessionResultAnswer(duplicate=not finished.accepted)

    async def _requeue(self, row: SessionRow, reason: str) -> Finished | None:
        outcome = self.store.requeue(row.session_id, row.attempt, reason, self.config.max_attempts)
        if outcome is not None:
            log.warning("session %s: %s", row.session_id, reason)
            await self._notify()
        return outcome

    def _healthy(self, node_id: str) -> bool:
        live = self._live.get(node_id)
        return live is not None and not live.dead and not live.unreachable

    # ---- dispatch -----------------------------------------------------------------------------------------------

    def _loads(self) -> list[NodeLoad]:
        assigned = self.store.assigned_counts()
        out = []
        for node in self.store.nodes():
            live = self._live.get(node.node_id)
            out.append(
                NodeLoad(
                    node_id=node.node_id,
                    run_slots=node.run_slots,
                    healthy=self._healthy(node.node_id),
                    draining=node.draining,
                    assigned=assigned.get(node.node_id, 0),
                    running=live.running if live else 0,
                    queued=live.queued if live else 0,
                    reserved=live.reserved if live else 0,
                )
            )
        return out

    async def _dispatch_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dispatch_wake.wait(), self.config.heartbeat_interval_s)
            self._dispatch_wake.clear()
            try:
                self._dispatch_pending()
            except Exception:
                log.exception("dispatch failed")

    def _dispatch_pending(self) -> None:
        pending = self.store.sessions(states=("pending",), limit=512)
        if not pending:
            return
        loads = {n.node_id: n for n in self._loads()}
        for row in pending:
            node = choose_node(
                loads.values(),
                max_queued=self.config.max_queued_per_node,
                reservations=self.config.reservations_per_node,
                avoid=row.node_id,
            )
            if node is None:
                return
            attempt = self.store.dispatch(row.session_id, node.node_id)
            if attempt is None:
                continue
            node.assigned += 1
            node.reserved += 1
            live = self._live.get(node.node_id)
            if live is not None:
                live.reserved += 1
            self._spawn(self._send(row, node.node_id, attempt))

    async def _send(self, row: SessionRow, node_id: str, attempt: int) -> None:
        """POST the session to its gateway; a call that fails undoes the dispatch (the node is marked unreachable
        until it heartbeats again), a 4xx answer (the gateway refuses the task) fails the session."""
        node = self.store.node(node_id)
        try:
            if node is None:
                raise SessionError(f"unknown node {node_id!r}")
            task = self._task(row.task_id)
            task = task.model_copy(update={"metadata": {**task.metadata, ATTEMPT_KEY: attempt}})
            body = {
                "task": task.model_dump(mode="json"),
                "sample_index": row.sample_index,
                "session_id": row.session_id,
            }
            response = await self.client.post(
                f"{node.url}/sessions", json=body, headers={"Authorization": f"Bearer {node.token}"}
            )
        except (httpx.HTTPError, PolarError) as exc:
            log.warning("session %s: dispatch to %s failed: %s", row.session_id, node_id, exc)
            if node_id in self._live:
                self._live[node_id].unreachable = True
            self.store.undo_dispatch(row.session_id, attempt)
            self._dispatch_wake.set()
            return
        if response.status_code < 300:
            return
        message = _error_message(response)
        if 400 <= response.status_code < 500 and response.status_code not in (401, 404, 409):
            error = f"node {node_id} refused the session: {message}"
            self.store.finish(
                row.session_id, failed_result(row.task_id, row.session_id, row.sample_index, "error", error)
            )
            await self._notify()
            return
        log.warning("session %s: node %s answered %s: %s", row.session_id, node_id, response.status_code, message)
        await self._requeue(self.store.session(row.session_id), f"node {node_id} answered {response.status_code}")

    async def _cancel_on_node(self, node_id: str, session_id: str) -> None:
        node = self.store.node(node_id)
        if node is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            await self.client.delete(
                f"{node.url}/sessions/{session_id}", headers={"Authorization": f"Bearer {node.token}"}
            )

    # ---- liveness and reconciliation ----------------------------------------------------------------------------

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s / 2)
            now = time.monotonic()
            for node_id, live in list(self._live.items()):
                if live.dead or now - live.last_seen <= self.config.dead_after_s:
                    continue
                live.dead = True
                log.warning("node %s missed its heartbeats: re-dispatching its sessions", node_id)
                for row in self.store.sessions(states=ASSIGNED, node_id=node_id):
                    await self._requeue(row, f"node {node_id} stopped heartbeating")

    async def _reconcile(self) -> None:
        """Sessions the database says a gateway holds: ask it (the server may have died mid-dispatch)."""
        rows = self.store.sessions(states=ASSIGNED)
        limit = asyncio.Semaphore(16)

        async def one(row: SessionRow) -> None:
            node = self.store.node(row.node_id or "")
            if node is None:
                await self._requeue(row, "its node is unknown")
                return
            async with limit:
                try:
                    response = await self.client.get(
                        f"{node.url}/sessions/{row.session_id}", headers={"Authorization": f"Bearer {node.token}"}
                    )
                except httpx.HTTPError:
                    return  # liveness decides about a node that does not answer
            if response.status_code == 404:
                await self._requeue(row, f"node {node.node_id} does not know the session")
            elif response.is_success and response.json().get("result") is not None:
                result = SessionResult.model_validate(response.json()["result"])
                attempt = int(result.metadata.get(ATTEMPT_KEY, row.attempt))
                await self._accept(row.session_id, node.node_id, attempt, result)

        await asyncio.gather(*(one(row) for row in rows), return_exceptions=True)


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
