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

from polar_cli.errors import SessionError, SessionExistsError
from polar_cli.ids import check_session_id
from polar_cli.interfaces.backend import BackendClient
from polar_cli.models import Completion
from polar_cli.proxy.journal import Journal, journal_path


def session_prefix(session_id: str) -> str:
    return f"/s/{session_id}"


def base_urls(base_url: str, session_id: str) -> dict[str, str]:
    """What a harness is given per provider family (its SDK appends the rest of the path)."""
    root = base_url.rstrip("/") + session_prefix(session_id)
    return {"anthropic": root, "openai": root + "/v1", "google": root}


@dataclass
class Session:
    session_id: str
    api_key: str
    metadata: dict[str, Any]
    created_at: float
    journal: Journal | None = None
    count: int = 0
    first_record: int = 0
    """Records the journal already held when this session was created (an earlier run of the same session id, e.g.
    one lost with a killed gateway): they are not this run's completions."""
    memory: list[bytes] = field(default_factory=list)  # JSON lines, as a journal would hold them

    def summary(self, base_url: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "completions": self.count,
            "journal": str(self.journal.path) if self.journal else None,
        }
        if base_url:
            out["base_urls"] = base_urls(base_url, self.session_id)
        return out


class SessionRegistry:
    """Every live session of one proxy. Routing, authentication and capture go through here."""

    def __init__(self, backend: BackendClient, journal_dir: Path | None = None) -> None:
        self.backend = backend
        self.journal_dir = journal_dir
        self._sessions: dict[str, Session] = {}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        backend_options: Mapping[str, Any] | None = None,
    ) -> Session:
        """A new session with its own secret; ``backend_options`` (e.g. ``script``) go to the backend."""
        session_id = session_id or uuid.uuid4().hex
        check_session_id(session_id)
        if session_id in self._sessions:
            raise SessionExistsError(f"session {session_id!r} already exists")
        metadata = dict(metadata or {})
        options = dict(backend_options or {})
        if "script" in metadata and "script" not in options:
            options["script"] = metadata.pop("script")
        await self.backend.open_session(session_id, options)
        session = Session(session_id, secrets.token_urlsafe(24), metadata, time.time())
        if self.journal_dir is not None:
            session.journal = Journal(journal_path(self.journal_dir, session_id))
            session.count = session.first_record = session.journal.existing_lines()
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionError(f"unknown session {session_id!r}") from None

    def authenticate(self, session_id: str, keys: list[str]) -> Session | None:
        """The session if any presented key is its secret (constant-time compare), else None."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        secret = session.api_key.encode()
        for key in keys:
            if hmac.compare_digest(key.encode(), secret):
                return session
        return None

    async def record(self, session: Session, record: dict[str, Any]) -> None:
        """Journal (write + flush) or keep one captured completion; ``record['index']`` must be ``session.count``.

        The count moves on before the journal write is awaited, so concurrent calls of one session take distinct,
        increasing indices and are written in that order."""
        session.count += 1
        if session.journal is not None:
            await session.journal.append_async(record)
        else:
            # serialized, like the journal: bytes cost the garbage collector nothing, 32K-int lists do
            session.memory.append(orjson.dumps(record))

    def completions_json(self, session_id: str) -> bytes:
        """The session's completions as one JSON array, in order, without re-parsing the journal."""
        session = self.get(session_id)
        lines = session.journal.read_raw()[session.first_record :] if session.journal is not None else session.memory
        return b"[" + b",".join(lines) + b"]"

    def get_completions(self, session_id: str) -> list[Completion]:
        session = self.get(session_id)
        lines = session.journal.read_raw()[session.first_record :] if session.journal is not None else session.memory
        return [Completion.model_validate(orjson.loads(line)) for line in lines]

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
