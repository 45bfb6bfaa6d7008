"""Typed clients of the rollout server (docs/service.md): ``PolarClient`` (sync) and ``AsyncPolarClient`` (async).

Both are thin httpx wrappers with the same methods; everything but the sending is shared (``_Call`` says what to send
and how to read the answer, ``_Poll`` drives ``wait`` and ``results``), so the two cannot drift apart::

    with PolarClient("http://127.0.0.1:8700", token) as client:   # or $POLAR_SERVER / $POLAR_TOKEN
        task_id = client.submit("task.yaml").task_id
        for result in client.results(task_id):                     # each SessionResult once, as it finishes
            ...
        final = client.wait(task_id)                               # the final TaskStatus
        for group in client.groups(tasks, GroupConfig(batch_size=8)):  # GRPO groups, as tasks end (groups.py)
            ...

Errors are mapped here, at the boundary: the server's 4xx/5xx become PolarErrors carrying its message (401
AuthError, 404 SessionError, 409 SessionExistsError, 400/422 and any other 4xx ConfigError, 502/503/504
ServiceUnavailableError), and httpx's transport errors
ServiceUnavailableError naming the URL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from polar_cli.config import load_model_file
from polar_cli.errors import (
    AuthError,
    ConfigError,
    PolarError,
    PoolControlError,
    RemovedError,
    ServiceUnavailableError,
    SessionError,
    SessionExistsError,
    TaskNotEndedError,
)
from polar_cli.groups import Group, GroupConfig, GroupRun, GroupStats, ReuseBuffer
from polar_cli.models import (
    TERMINAL_TASK_STATES,
    AckAnswer,
    InferenceStatus,
    ServiceStatus,
    SessionResult,
    SubmitAnswer,
    TaskList,
    TaskRequest,
    TaskStatus,
    validate_model,
)
from polar_cli.models.base import describe_validation_error
from polar_cli.models.inference import PauseMode
from polar_cli.node_protocol.messages import PAUSE_TIMEOUT_S, CancelStaleAnswer

log = logging.getLogger(__name__)

SERVER_ENV = "POLAR_SERVER"
TOKEN_ENV = "POLAR_TOKEN"
LONG_POLL_SECONDS = 30.0
"""``wait`` asks the server to hold each poll this long (the loop goes on until the task ends or the timeout)."""
RESULTS_POLL_SECONDS = 1.0
"""``results`` polls this often: the server's long poll returns early only when the task ends, not per result."""

TaskInput = TaskRequest | Mapping[str, Any] | str | os.PathLike[str]
"""A TaskRequest, its fields as a mapping, or the path of a YAML/JSON task file."""

M = TypeVar("M", bound=BaseModel)

_STATUS_ERRORS: dict[int, type[PolarError]] = {
    400: ConfigError,
    401: AuthError,
    403: AuthError,
    404: SessionError,
    409: SessionExistsError,
    410: RemovedError,
    422: ConfigError,
}
_INFERENCE_ERRORS: dict[int, type[PolarError]] = {**_STATUS_ERRORS, 404: ConfigError, 409: PoolControlError}
"""The ``/inference`` routes: a 409 is a gateway that failed or a version going back; a 404 a server without them."""


def as_task(task: TaskInput, task_id: str | None = None) -> TaskRequest:
    """``task`` as a validated TaskRequest (a path is read as YAML or JSON), under ``task_id`` when given (a task
    without an id gets a fresh one); a bad field is a ConfigError."""
    if isinstance(task, TaskRequest):
        request = task
    elif isinstance(task, str | os.PathLike):
        request = load_model_file(TaskRequest, Path(task))
    else:
        request = validate_model(TaskRequest, dict(task), source="the submitted task")
    if task_id is None:
        return request
    return validate_model(TaskRequest, {**request.model_dump(mode="json"), "task_id": task_id}, source="task_id")


def resolve_server(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The server URL and token: the arguments, else ``$POLAR_SERVER`` / ``$POLAR_TOKEN``. A URL without a scheme
    gets ``http://``."""
    url = url or os.environ.get(SERVER_ENV)
    if not url:
        raise ConfigError(f"no Polar server URL: pass one (--server URL) or set ${SERVER_ENV}")
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/"), token or os.environ.get(TOKEN_ENV) or None


def _error_for(response: httpx.Response, errors: Mapping[int, type[PolarError]] = _STATUS_ERRORS) -> PolarError:
    """The PolarError for a 4xx/5xx answer (its class from ``errors`` by status), carrying the server's own message
    (``{"error": {"message": ...}}``)."""
    message = ""
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            message = str(body["error"].get("message") or "")
    except ValueError:
        pass
    message = message or response.text.strip()[:300] or response.reason_phrase
    request = response.request
    where = f"{request.method} {request.url.path}"
    status = response.status_code
    fallback: type[PolarError] = ConfigError if 400 <= status < 500 else PolarError  # docs/cli.md: any 4xx exits 2
    if status in (502, 503, 504):
        fallback = ServiceUnavailableError
    return errors.get(status, fallback)(f"{message} (HTTP {status} on {where})")


def _transport_error(url: str, exc: httpx.HTTPError) -> PolarError:
    if isinstance(exc, httpx.ConnectError):
        return ServiceUnavailableError(f"cannot reach the Polar server at {url}: {exc or 'connection refused'}")
    if isinstance(exc, httpx.TimeoutException):
        return ServiceUnavailableError(f"the Polar server at {url} did not answer in time ({type(exc).__name__})")
    if isinstance(exc, httpx.TransportError):
        return ServiceUnavailableError(f"lost the connection to the Polar server at {url}: {exc}")
    return PolarError(f"request to the Polar server at {url} failed: {exc}")


@dataclass(frozen=True)
class _Call(Generic[M]):
    """One request to the server and the model its answer is read as."""

    method: str
    path: str
    answer: type[M]
    params: dict[str, float] = field(default_factory=dict)
    body: Any = None
    hold: float = 0.0  # seconds the server may hold the answer (long poll, pause), added to the client's timeout
    errors: Mapping[int, type[PolarError]] = field(default_factory=lambda: _STATUS_ERRORS)

    def read(self, response: httpx.Response) -> M:
        if response.is_error:
            raise _error_for(response, self.errors)
        try:
            return self.answer.model_validate_json(response.content)
        except ValidationError as exc:
            raise PolarError(
                f"unexpected answer to {self.method} {self.path} (not a {self.answer.__name__}): "
                f"{describe_validation_error(exc, self.answer)}"
            ) from exc


def _task_path(task_id: str) -> str:
    return f"/rollout/task/{quote(task_id, safe='')}"


def _submit_call(task: TaskInput, task_id: str | None) -> _Call[SubmitAnswer]:
    body = as_task(task, task_id).model_dump(mode="json")
    return _Call("POST", "/rollout/task/submit", SubmitAnswer, body=body)


def _status_call(task_id: str, wait: float | None = None) -> _Call[TaskStatus]:
    if wait is None:
        return _Call("GET", _task_path(task_id), TaskStatus)
    return _Call("GET", _task_path(task_id), TaskStatus, params={"wait": round(wait, 3)}, hold=wait)


def _request_call(task_id: str) -> _Call[TaskRequest]:
    return _Call("GET", f"{_task_path(task_id)}/request", TaskRequest)


def _ended_call(since: float) -> _Call[TaskList]:
    return _Call("GET", "/rollout/tasks", TaskList, params={"since": since})


def _ack_call(task_id: str) -> _Call[AckAnswer]:
    return _Call("POST", f"{_task_path(task_id)}/ack", AckAnswer, errors={**_STATUS_ERRORS, 409: TaskNotEndedError})


def _cancel_call(task_id: str) -> _Call[TaskStatus]:
    return _Call("DELETE", _task_path(task_id), TaskStatus)


def _service_call() -> _Call[ServiceStatus]:
    return _Call("GET", "/rollout/status", ServiceStatus)


def _inference_call(
    method: str, route: str, answer: type[M], body: dict[str, Any] | None = None, hold: float = 0.0
) -> _Call[M]:
    """A call under ``/inference`` (``route`` after it); ``body`` without its None values (the server's defaults)."""
    if body is not None:
        body = {key: value for key, value in body.items() if value is not None}
    return _Call(method, f"/inference{route}", answer, body=body, hold=hold, errors=_INFERENCE_ERRORS)


def _pools_call() -> _Call[InferenceStatus]:
    return _inference_call("GET", "", InferenceStatus)


def _pause_call(mode: PauseMode, timeout: float) -> _Call[InferenceStatus]:
    return _inference_call("POST", "/pause", InferenceStatus, {"mode": mode, "timeout_s": timeout}, hold=timeout)


def _resume_call(policy_version: int | None) -> _Call[InferenceStatus]:
    return _inference_call("POST", "/resume", InferenceStatus, {"policy_version": policy_version})


def _load_weights_call(path: str, policy_version: int | None, timeout: float) -> _Call[InferenceStatus]:
    body = {"path": path, "policy_version": policy_version, "timeout_s": timeout}
    return _inference_call("POST", "/load_weights", InferenceStatus, body, hold=2 * timeout)  # pause, then reload


def _add_backend_call(url: str) -> _Call[InferenceStatus]:
    return _inference_call("POST", "/backends", InferenceStatus, {"url": url})


def _remove_backend_call(url: str, timeout: float) -> _Call[InferenceStatus]:
    return _inference_call("DELETE", "/backends", InferenceStatus, {"url": url, "timeout_s": timeout}, hold=timeout)


def _cancel_stale_call(older_than: int | None) -> _Call[CancelStaleAnswer]:
    return _inference_call("POST", "/cancel_stale", CancelStaleAnswer, {"older_than": older_than})


def _group_run(
    config: GroupConfig | None, stats: GroupStats | None, reuse: ReuseBuffer | None, every: float, tasks: object
) -> GroupRun:
    """The run of one ``groups()`` call, its arguments checked first (then it takes what ``reuse`` holds)."""
    if every <= 0:
        raise ConfigError(f"the poll interval must be positive, not {every}")
    if isinstance(tasks, str | os.PathLike | Mapping | BaseModel):
        raise ConfigError("groups() takes an iterable of tasks, not one task: wrap it in a list")
    return GroupRun(config, stats, reuse)


def _group_polls(run: GroupRun, every: float) -> list[_Call[TaskStatus]]:
    return [_status_call(task_id, hold) for task_id, hold in run.polls(every)]


def _not_cancelled(task_id: str, exc: PolarError) -> None:
    log.warning("groups(): could not cancel task %s on the way out: %s", task_id, exc)


async def _async_source(tasks: Iterable[TaskInput] | AsyncIterable[TaskInput]) -> AsyncGenerator[TaskInput, None]:
    if isinstance(tasks, AsyncIterable):
        async for task in tasks:
            yield task
    else:
        for task in tasks:
            yield task


async def _together(calls: list[Awaitable[M]]) -> list[M]:
    """The answers of ``calls``, run concurrently; when one fails, the others are cancelled and its error raised."""
    running = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*running))
    except BaseException:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise


class _Poll:
    """Long-polls one task until it ends or ``timeout`` passes, each poll held up to ``every`` seconds; keeps the
    latest TaskStatus and hands out each SessionResult once (by session id)."""

    def __init__(self, task_id: str, timeout: float | None, every: float) -> None:
        if every <= 0:
            raise ConfigError(f"the poll interval must be positive, not {every}")
        self.task_id = task_id
        self.every = every
        self.deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        self.status: TaskStatus | None = None
        self.seen: set[str] = set()

    def next_call(self) -> _Call[TaskStatus] | None:
        """The next poll, or None when the task has ended or the time is up (after at least one poll)."""
        if self.status is not None:
            if self.status.state in TERMINAL_TASK_STATES:
                return None
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return None
        hold = self.every if self.deadline is None else min(self.every, max(0.0, self.deadline - time.monotonic()))
        return _status_call(self.task_id, wait=hold)

    def take(self, status: TaskStatus) -> list[SessionResult]:
        """Record a poll's answer; the results not handed out before, in sample order."""
        self.status = status
        fresh = [r for r in status.results if r.session_id not in self.seen]
        self.seen.update(r.session_id for r in fresh)
        return sorted(fresh, key=lambda r: (r.sample_index, r.session_id))

    def final(self) -> TaskStatus:
        assert self.status is not None, "poll at least once"
        return self.status


class _Base:
    def __init__(self, url: str | None, token: str | None, timeout: float) -> None:
        self.url, self.token = resolve_server(url, token)
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _request_args(self, call: _Call[Any]) -> dict[str, Any]:
        return {
            "method": call.method,
            "url": call.path,
            "params": call.params or None,
            "json": call.body,
            "timeout": self.timeout + call.hold,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class PolarClient(_Base):
    """Synchronous client of a rollout server. ``url``/``token`` default to ``$POLAR_SERVER``/``$POLAR_TOKEN``;
    ``timeout`` bounds each request (long polls get their hold time on top)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self._http = httpx.Client(base_url=self.url, headers=self._headers)

    def _send(self, call: _Call[M]) -> M:
        try:
            response = self._http.request(**self._request_args(call))
        except httpx.HTTPError as exc:
            raise _transport_error(self.url, exc) from exc
        return call.read(response)

    def submit(self, task: TaskInput, *, task_id: str | None = None) -> SubmitAnswer:
        """Submit a task, under ``task_id`` when given (else its own, else a fresh one). Idempotent per task_id and
        body (``.created`` is False then); another body under a taken id: SessionExistsError."""
        return self._send(_submit_call(task, task_id))

    def status(self, task_id: str) -> TaskStatus:
        return self._send(_status_call(task_id))

    def task_request(self, task_id: str) -> TaskRequest:
        """The task as it was submitted."""
        return self._send(_request_call(task_id))

    def ended_tasks(self, since: float = 0.0) -> list[str]:
        """The ids of the tasks that ended at or after ``since`` (seconds since the epoch), oldest first."""
        return self._send(_ended_call(since)).task_ids

    def wait(self, task_id: str, timeout: float | None = None) -> TaskStatus:
        """The task's TaskStatus once it has ended, or the latest one when ``timeout`` seconds pass first (check
        ``.state``)."""
        poll = _Poll(task_id, timeout, LONG_POLL_SECONDS)
        while (call := poll.next_call()) is not None:
            poll.take(self._send(call))
        return poll.final()

    def results(
        self, task_id: str, timeout: float | None = None, *, poll_interval: float = RESULTS_POLL_SECONDS
    ) -> Iterator[SessionResult]:
        """Each SessionResult of the task once, as sessions finish; ends when the task ends (or at ``timeout``)."""
        poll = _Poll(task_id, timeout, poll_interval)
        while (call := poll.next_call()) is not None:
            yield from poll.take(self._send(call))

    def cancel(self, task_id: str) -> TaskStatus:
        """Cancel the task's sessions everywhere; its TaskStatus."""
        return self._send(_cancel_call(task_id))

    def ack(self, task_id: str) -> AckAnswer:
        """Say the trainer has what it needs of the ended task: the server's retention settings may now compact or
        remove it (a task still running: TaskNotEndedError, HTTP 409). Acknowledging twice is harmless."""
        return self._send(_ack_call(task_id))

    def groups(
        self,
        tasks: Iterable[TaskInput],
        config: GroupConfig | None = None,
        *,
        stats: GroupStats | None = None,
        reuse: ReuseBuffer | None = None,
        poll_interval: float = RESULTS_POLL_SECONDS,
    ) -> Iterator[Group]:
        """Submit tasks from ``tasks`` (as ``config.max_in_flight`` allows) and yield each usable Group once every
        session of its task has finished, in the order tasks end (the rules: ``polar_cli.groups``). With
        ``config.batch_size`` it ends after that many, replacing dropped groups from the source, and cancels the tasks
        still running. Dropped groups, cancelled and unused tasks go to ``stats``. With ``reuse`` (the same buffer
        at every call), the surplus of the previous call comes out first, and this call's surplus is kept there
        instead of dropped (``keep_running``: not cancelled either). Leaving the loop early (break, an error) cancels
        the tasks still running, the carried ones too."""
        run = _group_run(config, stats, reuse, poll_interval, tasks)
        source = iter(tasks)
        try:
            while True:
                if run.ended:  # at first those carried in `reuse` (handed out first), then those the polls found
                    run.judge(self._send(_pools_call()).policy_version if run.needs_policy_version else None)
                while run.wants_task():
                    task = next(source, None)
                    if task is None:
                        run.source_ended()
                        break
                    request = run.admit(as_task(task))
                    self._send(_submit_call(request, None))
                    run.submitted(request)
                if run.batch_full:
                    for task_id in run.stop_surplus():
                        run.cancelled(self._send(_cancel_call(task_id)))
                yield from run.hand_out()  # after the refill: the next tasks sample while the caller trains
                if run.finished:
                    return
                for call in _group_polls(run, poll_interval):
                    run.take(self._send(call))
        except BaseException:
            for task_id in run.stop_running():
                try:
                    run.cancelled(self._send(_cancel_call(task_id)))
                except PolarError as exc:
                    _not_cancelled(task_id, exc)
            raise
        finally:
            run.close()

    def service_status(self) -> ServiceStatus:
        """``GET /rollout/status``: tasks by state, nodes, pending sessions."""
        return self._send(_service_call())

    # ---- the inference pools (docs/service.md, "Weight updates") ----

    def inference(self) -> InferenceStatus:
        """``GET /inference``: the policy version, whether sampling is paused, and every gateway's pool."""
        return self._send(_pools_call())

    def pause(self, mode: PauseMode = "wait", *, timeout: float = PAUSE_TIMEOUT_S) -> InferenceStatus:
        """Hold new model calls at every gateway; returns once no call is in flight (``wait``) or the calls in
        flight are frozen on their replicas (``keep``). PoolControlError, naming what it waited for, when a gateway
        fails or ``timeout`` seconds pass first (sampling stays paused: resume, or pause again)."""
        return self._send(_pause_call(mode, timeout))

    def resume(self, policy_version: int | None = None) -> InferenceStatus:
        """Every gateway samples again, under ``policy_version`` (default: the current one + 1; lower than the
        current one is a PoolControlError)."""
        return self._send(_resume_call(policy_version))

    def load_weights(
        self, path: str | os.PathLike[str], policy_version: int | None = None, *, timeout: float = PAUSE_TIMEOUT_S
    ) -> InferenceStatus:
        """Pause, have every replica reload its weights from ``path`` (on the inference servers' machines), resume
        under ``policy_version`` (default: the current one + 1). ``timeout`` bounds the pause and the reload."""
        return self._send(_load_weights_call(str(path), policy_version, timeout))

    def add_backend(self, url: str) -> InferenceStatus:
        """Add inference server ``url`` to every gateway's pool (those that have it already are left alone)."""
        return self._send(_add_backend_call(url))

    def remove_backend(self, url: str, *, timeout: float = PAUSE_TIMEOUT_S) -> InferenceStatus:
        """Take ``url`` out of every pool that has it: no new calls; its calls in flight get ``timeout`` seconds."""
        return self._send(_remove_backend_call(url, timeout))

    def cancel_stale(self, older_than: int | None = None) -> CancelStaleAnswer:
        """Cancel (status ``stale``) every running session whose oldest completion was sampled under a version older
        than ``older_than`` (default: the current one); the ids cancelled."""
        return self._send(_cancel_stale_call(older_than))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PolarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPolarClient(_Base):
    """The asyncio twin of ``PolarClient``: the same methods, awaited; ``results`` is an async iterator."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers)

    async def _send(self, call: _Call[M]) -> M:
        try:
            response = await self._http.request(**self._request_args(call))
        except httpx.HTTPError as exc:
            raise _transport_error(self.url, exc) from exc
        return call.read(response)

    async def submit(self, task: TaskInput, *, task_id: str | None = None) -> SubmitAnswer:
        """Submit a task, under ``task_id`` when given (else its own, else a fresh one). Idempotent per task_id and
        body (``.created`` is False then); another body under a taken id: SessionExistsError."""
        return await self._send(_submit_call(task, task_id))

    async def status(self, task_id: str) -> TaskStatus:
        return await self._send(_status_call(task_id))

    async def task_request(self, task_id: str) -> TaskRequest:
        return await self._send(_request_call(task_id))

    async def ended_tasks(self, since: float = 0.0) -> list[str]:
        return (await self._send(_ended_call(since))).task_ids

    async def wait(self, task_id: str, timeout: float | None = None) -> TaskStatus:
        """The task's TaskStatus once it has ended, or the latest one when ``timeout`` seconds pass first."""
        poll = _Poll(task_id, timeout, LONG_POLL_SECONDS)
        while (call := poll.next_call()) is not None:
            poll.take(await self._send(call))
        return poll.final()

    async def results(
        self, task_id: str, timeout: float | None = None, *, poll_interval: float = RESULTS_POLL_SECONDS
    ) -> AsyncIterator[SessionResult]:
        """Each SessionResult of the task once, as sessions finish; ends when the task ends (or at ``timeout``)."""
        poll = _Poll(task_id, timeout, poll_interval)
        while (call := poll.next_call()) is not None:
            for result in poll.take(await self._send(call)):
                yield result

    async def cancel(self, task_id: str) -> TaskStatus:
        return await self._send(_cancel_call(task_id))

    async def ack(self, task_id: str) -> AckAnswer:
        """:meth:`PolarClient.ack`."""
        return await self._send(_ack_call(task_id))

    async def groups(
        self,
        tasks: Iterable[TaskInput] | AsyncIterable[TaskInput],
        config: GroupConfig | None = None,
        *,
        stats: GroupStats | None = None,
        reuse: ReuseBuffer | None = None,
        poll_interval: float = RESULTS_POLL_SECONDS,
    ) -> AsyncIterator[Group]:
        """``PolarClient.groups`` as an async iterator; ``tasks`` may be an async iterable. The polls of a round go
        out together. To cancel the tasks still running as soon as a loop is left early, use
        ``contextlib.aclosing``."""
        run = _group_run(config, stats, reuse, poll_interval, tasks)
        source = _async_source(tasks)
        try:
            while True:
                if run.ended:  # at first those carried in `reuse` (handed out first), then those the polls found
                    run.judge((await self._send(_pools_call())).policy_version if run.needs_policy_version else None)
                while run.wants_task():
                    task = await anext(source, None)
                    if task is None:
                        run.source_ended()
                        break
                    request = run.admit(as_task(task))
                    await self._send(_submit_call(request, None))
                    run.submitted(request)
                if run.batch_full:
                    for task_id in run.stop_surplus():
                        run.cancelled(await self._send(_cancel_call(task_id)))
                for group in run.hand_out():  # after the refill: the next tasks sample while the caller trains
                    yield group
                if run.finished:
                    return
                for status in await _together([self._send(call) for call in _group_polls(run, poll_interval)]):
                    run.take(status)
        except BaseException:
            for task_id in run.stop_running():
                try:
                    run.cancelled(await self._send(_cancel_call(task_id)))
                except PolarError as exc:
                    _not_cancelled(task_id, exc)
            raise
        finally:
            run.close()
            await source.aclose()

    async def service_status(self) -> ServiceStatus:
        return await self._send(_service_call())

    async def inference(self) -> InferenceStatus:
        return await self._send(_pools_call())

    async def pause(self, mode: PauseMode = "wait", *, timeout: float = PAUSE_TIMEOUT_S) -> InferenceStatus:
        return await self._send(_pause_call(mode, timeout))

    async def resume(self, policy_version: int | None = None) -> InferenceStatus:
        return await self._send(_resume_call(policy_version))

    async def load_weights(
        self, path: str | os.PathLike[str], policy_version: int | None = None, *, timeout: float = PAUSE_TIMEOUT_S
    ) -> InferenceStatus:
        return await self._send(_load_weights_call(str(path), policy_version, timeout))

    async def add_backend(self, url: str) -> InferenceStatus:
        return await self._send(_add_backend_call(url))

    async def remove_backend(self, url: str, *, timeout: float = PAUSE_TIMEOUT_S) -> InferenceStatus:
        return await self._send(_remove_backend_call(url, timeout))

    async def cancel_stale(self, older_than: int | None = None) -> CancelStaleAnswer:
        return await self._send(_cancel_stale_call(older_than))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPolarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
