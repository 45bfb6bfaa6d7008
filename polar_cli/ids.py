"""Identifier rules shared by every module: one session-id rule, checked with ``fullmatch``, and the id a new
session gets (``session_id_for``).

A session id names a journal file, a result file and a URL path segment, so it may hold only letters, digits, ``.``,
``_`` and ``-``, starts with a letter or digit (never ``.``: no hidden files, no ``..``), and is at most 128 long. The
rule is a full match: ``re.match`` with ``$`` would accept a trailing newline.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated

from pydantic import AfterValidator

from polar_cli.errors import ConfigError

SESSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SESSION_ID_RULE = "letters, digits, '.', '_', '-', starting with a letter or digit, at most 128 characters"
_OUTSIDE_RULE = re.compile(r"[^A-Za-z0-9._-]+")


def is_session_id(value: object) -> bool:
    """True when ``value`` is a string that is a valid session id in full."""
    return isinstance(value, str) and SESSION_ID_RE.fullmatch(value) is not None


def check_session_id(value: object, *, what: str = "session_id") -> str:
    """``value`` if it is a valid session id, else ConfigError naming the rule."""
    if not is_session_id(value):
        raise ConfigError(f"invalid {what} {value!r}: use {SESSION_ID_RULE}")
    assert isinstance(value, str)
    return value


def id_part(text: str, limit: int = 96) -> str:
    """``text`` made fit to start a session id: other characters become ``_``, no leading or trailing ``._-``,
    at most ``limit`` long ("" when nothing is left)."""
    return _OUTSIDE_RULE.sub("_", text).strip("._-")[:limit]


def session_id_for(task_id: str, sample_index: int) -> str:
    """``<task id, made safe>-<sample>-<random>``: readable and unique."""
    slug = id_part(task_id) or "task"
    return f"{slug}-{sample_index}-{secrets.token_hex(4)}"


def session_ids_for(task_id: str, count: int) -> list[str]:
    """:func:`session_id_for` of samples ``0 .. count - 1``, the random parts drawn in one call."""
    slug = id_part(task_id) or "task"
    noise = secrets.token_hex(4 * count)
    return [f"{slug}-{i}-{noise[8 * i : 8 * i + 8]}" for i in range(count)]


def _validate_session_id(value: str) -> str:
    if not is_session_id(value):
        raise ValueError(f"not a valid session id: use {SESSION_ID_RULE}")
    return value


SessionId = Annotated[str, AfterValidator(_validate_session_id)]
"""A pydantic field type holding a valid session id."""
