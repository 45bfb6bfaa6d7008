"""Retention: what the rollout server may drop of the tasks a trainer has acknowledged, and when.

A task is acknowledged once it has ended and its trainer has said it has what it needs: ``POST
/rollout/task/{id}/ack`` (``PolarClient.ack``), or every callback of the task (its session results, then its status)
delivered to its ``callback_url``. Only such a task, with no callback still to deliver, is ever compacted (its
traces dropped, its results' summaries kept) or removed (its results gone; the server answers 410 for it), the
oldest acknowledgement first: once it is older than ``max_age``, or while the data kept is over ``max_bytes``.
Running and unacknowledged tasks are never touched. The default keeps everything.

This module is the policy (a pure model and a pure selection); the database side is
``polar_cli.server.store_retention``, the files and the measurement of the data dir ``polar_cli.server.disk``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from polar_cli.models import StrictModel

RetentionMode = Literal["remove", "compact"]
Retained = Literal["compacted", "removed"]
"""What retention did to a task (a task it never touched has neither)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_DURATION_UNITS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_duration(value: Any) -> float:
    """Seconds, from a number or a string such as ``"90"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value.lower())):
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration: give seconds, or a number with s, m, h, d or w (e.g. '7d')")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{value!r} is not a duration: it must be more than 0 seconds")
    return seconds


def parse_size(value: Any) -> int:
    """Bytes, from a number or a string such as ``"500MB"``, ``"50GB"``, ``"2GiB"`` (KB, MB, GB, TB: powers of 1000;
    KiB, MiB, GiB, TiB: of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int | float):
        size = float(value)
    elif isinstance(value, str) and (match := _SIZE.match(value)):
        unit = (match.group(2) or "b").lower()
        base = 1024 if "i" in unit else 1000
        size = float(match.group(1)) * base ** _SIZE_POWERS.get(unit[0], 0)
    else:
        raise ValueError(f"{value!r} is not a size: give bytes, or a number with KB, MB, GB, TB (or KiB, MiB, GiB, "
                         "TiB), e.g. '50GB'")  # fmt: skip
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"{value!r} is not a size: it must be at least 1 byte")
    return int(size)


class RetentionConfig(StrictModel):
    """``retention:`` of ``polar serve``'s server section (and of ``polar generate``'s embedded service)."""

    max_age: float | None = Field(
        default=None,
        description="acknowledged tasks older than this (seconds, or '12h', '7d', ...; counted from their "
        "acknowledgement) are compacted or removed (default: no age limit)",
    )
    max_bytes: int | None = Field(
        default=None,
        description="while the data kept (database in use, results/ and journal/) is over this (bytes, or '50GB', "
        "'2GiB', ...), the oldest acknowledged tasks are compacted or removed (default: no size limit)",
    )
    mode: RetentionMode = Field(
        default="remove",
        description="remove: the task's results and files go, the server answers 410 for it; compact: its traces "
        "and files go, its results' summaries (status, reward, error, metadata) stay",
    )
    interval_s: float = Field(default=60.0, gt=0, description="how often retention runs (it also runs at start)")

    @field_validator("max_age", mode="before")
    @classmethod
    def _age(cls, value: Any) -> float | None:
        return None if value is None else _parsed(parse_duration, value)

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> int | None:
        return None if value is None else _parsed(parse_size, value)

    @property
    def enabled(self) -> bool:
        return self.max_age is not None or self.max_bytes is not None

    def describe(self) -> str:
        """``remove acknowledged tasks after 7d or over 50.0 GB``, or ``keep everything``."""
        if not self.enabled:
            return "keep everything"
        limits = []
        if self.max_age is not None:
            limits.append(f"after {format_duration(self.max_age)}")
        if self.max_bytes is not None:
            limits.append(f"over {format_size(self.max_bytes)}")
        return f"{self.mode} acknowledged tasks {' or '.join(limits)}"


def _parsed(parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except ValueError as exc:  # its message alone (pydantic would put "Value error, " before it)
        raise PydanticCustomError("retention_value", "{message}", {"message": str(exc)}) from exc


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def format_size(size: float) -> str:
    for unit, power in (("TB", 4), ("GB", 3), ("MB", 2), ("kB", 1)):
        if size >= 1000**power:
            return f"{size / 1000**power:.1f} {unit}"
    return f"{int(size)} B"


@dataclass(frozen=True)
class Candidate:
    """An acknowledged task retention may act on (ended, no callback left to deliver)."""

    task_id: str
    acked_at: float
    retained: Retained | None


@dataclass(frozen=True)
class Selected:
    task_id: str
    reason: Literal["age", "size"]
    bytes: int
    """What it held before (its results in the database, its files), the part retention frees or shrinks."""


def select(
    candidates: Iterable[Candidate],
    config: RetentionConfig,
    *,
    now: float,
    used_bytes: int,
    size_of: Callable[[Candidate], int],
) -> list[Selected]:
    """The tasks to compact or remove now, oldest acknowledgement first: every one acknowledged more than
    ``max_age`` ago, then more while ``used_bytes`` minus what the ones chosen hold is over ``max_bytes``.

    ``candidates`` come oldest acknowledgement first; they are read (and ``size_of`` called) only as far as needed.
    A task already compacted is a candidate only in mode remove."""
    cutoff = -math.inf if config.max_age is None else now - config.max_age
    excess = -1 if config.max_bytes is None else used_bytes - config.max_bytes
    chosen: list[Selected] = []
    for candidate in candidates:
        old = candidate.acked_at <= cutoff
        if not old and excess <= 0:
            break  # the rest are younger, and the data kept is within its cap
        if candidate.retained == "removed" or (candidate.retained == "compacted" and config.mode == "compact"):
            continue
        size = size_of(candidate)
        chosen.append(Selected(candidate.task_id, "age" if old else "size", size))
        excess -= size
    return chosen
