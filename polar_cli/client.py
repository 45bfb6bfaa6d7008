"""Typed clients of the rollout server (docs/service.md): ``PolarClient`` (sync) and ``AsyncPolarClient`` (async).

Both are thin httpx wrappers with the same methods; everything but the sending is shared (``_Call`` says what to send
and how to read the answer, ``_Poll`` drives ``wait`` and ``results``), so the two cannot drift apart::

    with PolarClient("http://127.0.0.1:8700", token) as client:   # or $POLAR_SERVER / $POLAR_TOKEN
        task_id = client.submit("task.yaml").task_id
        for result in client.results(task_id):                     # each SessionResult once, as it finishes
            ...
        final = client.wait(task_id)                               # the final TaskStatus

Errors are mapped here, at the boundary: the server's 4xx/5xx become PolarErrors carrying its message (401
AuthError, 404 SessionError, 409 SessionExistsError, 400/422 ConfigError), and httpx's transport errors
ServiceUnavailableError naming the URL.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
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
    ServiceUnavailableError,
    SessionError,
    SessionExistsError,
)
from polar_cli.models import (
    TERMINAL_TASK_STATES,
    ServiceStatus,
    SessionResult,
    SubmitAnswer,
    TaskRequest,
    TaskStatus,
    validate_model,
)
from polar_cli.models.base import describe_validation_error

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
    422: ConfigError,
}


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


def _error_for(response: httpx.Response) -> PolarError:
    """The PolarError for a 4xx/5xx answer, carrying the server's own message (``{"error": {"message": ...}}``)."""
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
    return _STATUS_ERRORS.get(response.status_code, PolarError)(f"{message} (HTTP {response.status_code} on {where})")


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
    hold: float = 0.0  # seconds the server may hold the answer (long poll), added to the client's timeout

    def read(self, response: httpx.Response) -> M:
        if response.is_error:
            raise _error_for(response)
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


def _cancel_call(task_id: str) -> _Call[TaskStatus]:
    return _Call("DELETE", _task_path(task_id), TaskStatus)


def _service_call() -> _Call[ServiceStatus]:
    return _Call("GET", "/rollout/status", ServiceStatus)


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

    def service_status(self) -> ServiceStatus:
        """``GET /rollout/status``: tasks by state, nodes, pending sessions."""
        return self._send(_service_call())

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

    async def service_status(self) -> ServiceStatus:
        return await self._send(_service_call())

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPolarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
