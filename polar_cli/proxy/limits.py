"""A task's ``agent.limits`` (``SessionLimits``) on one proxy session: what it has used, and the first limit it hit.

The proxy asks :meth:`SessionGuard.admit` before a generation call goes upstream: a call beyond ``max_model_calls``,
one made once ``max_sampled_tokens`` is reached, or any call after ``repeat_limit`` tripped is refused (a
provider-shaped 403 naming the limit) and records nothing. ``max_call_tokens`` caps each admitted call's max tokens
(:meth:`SessionGuard.clamp`). An admitted call is settled (:meth:`SessionGuard.settle`) with its sampled token ids
once recorded, with None when it failed. The first limit hit is kept (:attr:`SessionGuard.hit`) and sets
:attr:`SessionGuard.tripped`, which the gateway's session driver waits on to stop the harness (status ``limit``).

Reaching ``max_model_calls`` or ``max_sampled_tokens`` is no hit by itself: a harness that stops there completes. The
hit is the call it makes after. ``repeat_limit`` is loop detection: the N-th consecutive completion with the same
sampled token ids as the one before trips it at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from polar_cli.models.task import SessionLimits


@dataclass(frozen=True)
class LimitHit:
    """The first limit a session hit: its ``SessionLimits`` field, the limit's value, what the session had used."""

    name: str
    limit: int
    calls: int
    sampled_tokens: int
    message: str
    """``limit NAME=VALUE reached ...``: the session's error."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "limit": self.limit, "calls": self.calls, "sampled_tokens": self.sampled_tokens}


class SessionGuard:
    """The counters of one session under its limits. Calls of one session may run concurrently: a call counts from
    its admission, so concurrent calls cannot together pass ``max_model_calls``."""

    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self.calls = 0
        """Recorded calls."""
        self.in_flight = 0
        """Admitted calls not settled yet."""
        self.sampled_tokens = 0
        self.repeats = 0
        """How many consecutive recorded calls, up to the last one, sampled the same token ids."""
        self._last_ids: list[int] | None = None
        self.hit: LimitHit | None = None
        self.tripped = asyncio.Event()

    def admit(self) -> LimitHit | None:
        """Before a call goes upstream: the limit that refuses it (the session's first hit, recorded now if this is
        it), else None, and the call is in flight until :meth:`settle`."""
        if self.hit is not None:
            return self.hit
        limits, admitted = self.limits, self.calls + self.in_flight
        if limits.max_model_calls is not None and admitted >= limits.max_model_calls:
            return self._trip("max_model_calls", limits.max_model_calls, f"reached after {admitted} calls")
        if limits.max_sampled_tokens is not None and self.sampled_tokens >= limits.max_sampled_tokens:
            return self._trip("max_sampled_tokens", limits.max_sampled_tokens,
                              f"reached: {self.sampled_tokens} tokens sampled in {self.calls} calls")  # fmt: skip
        self.in_flight += 1
        return None

    def clamp(self, params: dict[str, Any]) -> None:
        """Cap one admitted call's max tokens (``ChatRequest.params``, OpenAI chat names) by ``max_call_tokens``: the
        harness's own smaller value stays."""
        cap = self.limits.max_call_tokens
        if cap is None:
            return
        asked = params.get("max_tokens")
        number = isinstance(asked, int | float) and not isinstance(asked, bool)
        params["max_tokens"] = min(asked, cap) if number and asked is not None else cap

    def settle(self, response_ids: list[int] | None) -> None:
        """An admitted call is over: recorded with its sampled ``response_ids``, or failed (None: nothing counts)."""
        self.in_flight = max(0, self.in_flight - 1)
        if response_ids is None:
            return
        self.calls += 1
        self.sampled_tokens += len(response_ids)
        self.repeats = self.repeats + 1 if response_ids == self._last_ids else 1
        self._last_ids = list(response_ids)
        limit = self.limits.repeat_limit
        if limit is not None and self.repeats >= limit and self.hit is None:
            self._trip("repeat_limit", limit, f"reached: the same assistant output ({len(response_ids)} tokens) "
                                              f"{self.repeats} times in a row")  # fmt: skip

    def _trip(self, name: str, limit: int, how: str) -> LimitHit:
        self.hit = LimitHit(name, limit, self.calls, self.sampled_tokens, f"limit {name}={limit} {how}")
        self.tripped.set()
        return self.hit

    def summary(self) -> dict[str, Any]:
        """The limits, what the session has used and the hit, if any (for the session's control routes)."""
        return {
            "limits": self.limits.set(),
            "calls": self.calls,
            "sampled_tokens": self.sampled_tokens,
            "hit": self.hit.as_dict() if self.hit is not None else None,
        }
