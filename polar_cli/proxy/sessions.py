"""Sessions: a per-session secret, a path prefix, a journal; the registry the gateway drives from Python."""

from __future__ import annotations

import hmac
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polar_cli.errors import ConfigError, SessionError, SessionExistsError, brief
from polar_cli.ids import check_session_id
from polar_cli.interfaces.backend import BackendClient, no_token_in
from polar_cli.models import Completion, TokenMode, validate_model
from polar_cli.models.task import SCRIPT_KEY, SamplingSpec, SessionLimits
from polar_cli.proxy.journal import Journal, journal_path, validate_lines
from polar_cli.proxy.limits import LimitHit, SessionGuard
from polar_cli.proxy.pool import InferencePool
from polar_cli.proxy.sampling import RawLogprobsWarning
from polar_cli.proxy.token_prompt import TokenHistory


def session_prefix(session_id: str) -> str:
    return f"/s/{session_id}"


def base_urls(base_url: str, session_id: str) -> dict[str, str]:
    """What a harness is given per provider family (its SDK appends the rest of the path)."""
    root = base_url.rstrip("/") + session_prefix(session_id)
    return {"anthropic": root, "openai": root + "/v1", "google": root}


def _allowed(backend: BackendClient, options: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not options:
        return {}
    model = backend.session_options
    if model is None:
        names = ", ".join(sorted(options))
        raise ConfigError(f"{where}: the {backend.name or 'configured'} backend takes no per-session options ({names})")
    return validate_model(model, dict(options), source=where).model_dump(exclude_unset=True)


INLINE_SCRIPT_RULE = (
    "a session's script must be an inline list of turns, or a mapping of variants (script files come only from "
    "--script)"
)
SAMPLE_INDEX_KEY = "sample_index"
"""``metadata.sample_index`` (set by the gateway for each session of a task): which variant of a script it plays."""


def affinity_group(metadata: Mapping[str, Any]) -> str | None:
    """The group a session samples for, which the inference pool keeps on one replica (the samples of a group share
    their prompt, so that replica's prefix cache prefills it once): ``metadata.group_id`` when the task names one (as
    trainers group by it), else ``metadata.task_id`` (the gateway sets it: one task, one group); None: neither."""
    for key in ("group_id", "task_id"):
        value = metadata.get(key)
        if value is not None and value != "":
            return str(value)
    return None


def inline_script(script: Any) -> list[Any] | dict[str, Any]:
    """``script`` when it is inline (a list of turns, or a mapping of variants); else ConfigError: a session or task
    may not name a host file."""
    if not isinstance(script, list | dict):
        raise ConfigError(f"{INLINE_SCRIPT_RULE}, not {type(script).__name__} {brief(script)}")
    return script


def session_options(
    backend: BackendClient, metadata: Mapping[str, Any] | None, backend_options: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A session's ``(metadata, backend options)``: the options are checked against the backend's allow-list
    (``BackendClient.session_options``; ConfigError → 400 naming the field). ``metadata.script`` must be an inline
    list; it moves to the options of a backend that takes a ``script`` and is dropped for one that does not (a task's
    script is for the scripted backend). ``metadata.sample_index`` also goes to a backend that takes a
    ``sample_index`` (the scripted backend picks a script's variant with it). Pure: nothing is opened or read, so a
    session can be checked before it is created."""
    metadata = dict(metadata or {})
    options = _allowed(backend, backend_options or {}, "backend_options")
    if SCRIPT_KEY in metadata:
        try:
            script = inline_script(metadata.pop(SCRIPT_KEY))
        except ConfigError as exc:
            raise ConfigError(f"metadata.script: {exc}") from exc
        model = backend.session_options
        if model is not None and "script" in model.model_fields:
            if "script" in options:
                raise ConfigError("a session's script is given twice: metadata.script and the session's own script")
            options.update(_allowed(backend, {"script": script}, "metadata.script"))
    model = backend.session_options
    sample_index = metadata.get(SAMPLE_INDEX_KEY)
    takes_it = model is not None and SAMPLE_INDEX_KEY in model.model_fields and SAMPLE_INDEX_KEY not in options
    if takes_it and type(sample_index) is int and sample_index >= 0:
        options[SAMPLE_INDEX_KEY] = sample_index
    return metadata, options


@dataclass
class Session:
    session_id: str
    api_key: str
    metadata: dict[str, Any]
    created_at: float
    journal: Journal | None = None
    count: int = 0
    """The next completion index: the largest index on disk + 1 (ids are unique forever, gaps or not)."""
    first_record: int = 0
    """Records of the journal that are not this session's: with ``create_session(fresh=True)``, those it already held
    (an earlier attempt of the same session id, e.g. one lost with a killed gateway)."""
    memory: list[bytes] = field(default_factory=list)  # JSON lines, as a journal would hold them
    deadline: float | None = None
    """``time.monotonic()`` after which no backend call of this session runs (set by whoever runs the session)."""
    sampling: SamplingSpec | None = None
    """Forced onto every model call of the session (its task's ``agent.sampling``)."""
    guard: SessionGuard | None = None
    """Its task's ``agent.limits`` and what it has used of them (None: no limits)."""
    model_requests: int = 0
    """Generation requests the harness sent (authenticated), recorded or refused: tells a harness that never reached
    the proxy from one whose every call failed."""
    token_mode: TokenMode = "messages"
    """How its calls' prompts are built: rendered by the server, or as ids (:mod:`polar_cli.proxy.token_prompt`)."""
    keep_reasoning: bool = True
    """Token mode: earlier reasoning stays in the prompt as sampled (else it is dropped, as the template drops it)."""
    tokens: TokenHistory | None = None
    """Token mode: its recorded completions as later calls splice them."""
    oldest_version: int | None = None
    """The oldest policy version its recorded completions were sampled under (None: none recorded one yet): what
    staleness is judged by, kept as calls are recorded so that nobody re-reads the journal for it."""

    @property
    def task_key(self) -> str:
        """What the once-per-task warnings are keyed by: ``metadata.task_id``, else the session id."""
        task_id = self.metadata.get("task_id")
        return str(task_id) if task_id is not None else self.session_id

    @property
    def limit_hit(self) -> LimitHit | None:
        """The first of its limits the session hit (its later calls are refused), else None."""
        return self.guard.hit if self.guard is not None else None

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def summary(self, base_url: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "completions": self.count,
            "journal": str(self.journal.path) if self.journal else None,
            "sampling": self.sampling.forced() if self.sampling is not None else None,
            "limits": self.guard.summary() if self.guard is not None else None,
            "token_mode": self.token_mode,
        }
        if base_url:
            out["base_urls"] = base_urls(base_url, self.session_id)
        return out


class SessionRegistry:
    """Every live session of one proxy. Routing, authentication and capture go through here."""

    def __init__(
        self, backend: InferencePool, journal_dir: Path | None = None, token_mode: TokenMode = "messages"
    ) -> None:
        self.backend = backend
        self.journal_dir = journal_dir
        self.token_mode = token_mode
        """The mode of sessions created without one (the proxy's ``token_mode``)."""
        self._sessions: dict[str, Session] = {}
        self.raw_logprobs = RawLogprobsWarning()

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        backend_options: Mapping[str, Any] | None = None,
        *,
        fresh: bool = False,
        sampling: SamplingSpec | None = None,
        limits: SessionLimits | None = None,
        token_mode: TokenMode | None = None,
        keep_reasoning: bool = True,
    ) -> Session:
        """A new session with its own secret; ``backend_options`` (e.g. an inline ``script``) go to the backend,
        checked against its allow-list (see :func:`session_options`); ``sampling`` is forced onto its every call and
        ``limits`` are enforced on them (:mod:`polar_cli.proxy.limits`). The pool places it by its group
        (:func:`affinity_group`).

        A session id whose journal already has records continues it: numbering goes on after the last index, and the
        session's completions include the earlier ones (a proxy restarted under a harness). With ``fresh`` the earlier
        records are not this session's (a gateway running a new attempt of a session under the same id): they stay on
        disk, numbering still goes on, but the session's completions start after them."""
        session_id = session_id or uuid.uuid4().hex
        check_session_id(session_id)
        if session_id in self._sessions:
            raise SessionExistsError(f"session {session_id!r} already exists")
        metadata, options = session_options(self.backend, metadata, backend_options)
        mode = token_mode or self.token_mode
        if mode == "tokens" and not self.backend.token_in:
            raise ConfigError(no_token_in(self.backend.name or type(self.backend).__name__))
        stale_fraction = sampling.stale_fraction if sampling is not None else None
        await self.backend.open_session(session_id, options, group=affinity_group(metadata),
                                        stale_fraction=stale_fraction)  # fmt: skip
        session = Session(session_id, secrets.token_urlsafe(24), metadata, time.time(), sampling=sampling,
                          token_mode=mode, keep_reasoning=keep_reasoning)  # fmt: skip
        if mode == "tokens":
            session.tokens = TokenHistory()
        if limits is not None and limits.set():
            session.guard = SessionGuard(limits)
        if self.journal_dir is not None:
            session.journal = Journal(journal_path(self.journal_dir, session_id))
            session.count = session.journal.next_index
            if fresh:
                session.first_record = len(session.journal.read_raw())
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionError(f"unknown session {session_id!r}") from None

    def authenticate(self, session_id: str, keys: list[bytes]) -> Session | None:
        """The session if any presented key (raw header bytes) is its secret (constant-time compare), else None."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        secret = session.api_key.encode()
        for key in keys:
            if hmac.compare_digest(key, secret):
                return session
        return None

    def set_deadline(self, session_id: str, deadline: float | None) -> None:
        """Bound the backend calls of a live session by ``deadline`` (``time.monotonic()``); unknown ids: no-op."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.deadline = deadline

    async def record(self, session: Session, record: dict[str, Any]) -> int:
        """Journal (write + flush) or keep one captured completion; ``record['index']`` must be ``session.count``.
        Returns the bytes appended to the journal (0 without one).

        The count moves on before the journal write is awaited, so concurrent calls of one session take distinct,
        increasing indices and are written in that order. A failed write leaves a gap in the indices, never a reused
        one."""
        session.count += 1
        version = record.get("policy_version")
        if isinstance(version, int) and (session.oldest_version is None or version < session.oldest_version):
            session.oldest_version = version
        if session.journal is not None:
            return await session.journal.append_async(record)
        # serialized, like the journal: bytes cost the garbage collector nothing, 32K-int lists do
        session.memory.append(orjson.dumps(record))
        return 0

    def completions_json(self, session_id: str) -> bytes:
        """The session's completions as one JSON array, in order (journal lines that are not records are skipped)."""
        session = self.get(session_id)
        lines = session.journal.read_raw()[session.first_record :] if session.journal is not None else session.memory
        return b"[" + b",".join(lines) + b"]"

    def get_completions(self, session_id: str) -> list[Completion]:
        """The session's Completions, in order; a line that does not validate is skipped and logged."""
        session = self.get(session_id)
        if session.journal is not None:
            return validate_lines(session.journal.read_raw()[session.first_record :], session.journal.path)
        return validate_lines(session.memory, f"session {session_id} (in memory)")

    async def close_session(self, session_id: str) -> Session:
        """Stop routing the session (its journal stays on disk) and let the backend forget it."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionError(f"unknown session {session_id!r}")
        if session.journal is not None:
            await session.journal.aclose()
        await self.backend.close_session(session_id)
        return session

    async def close_all(self) -> None:
        for session_id in list(self._sessions):
            await self.close_session(session_id)
