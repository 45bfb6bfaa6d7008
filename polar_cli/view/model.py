"""The view model: what ``polar view`` draws, whichever input it came from, in the compact shape the page reads.

A ``SessionView`` is one session's summary (the list row) plus its chains; a ``ChainView`` is one trace: prompt ids,
response ids, loss mask, logprobs, token texts where known, messages, and how its chain began. ``index_row`` and
``detail`` are the JSON the page embeds (short keys: a page of 10,000 sessions stays a few megabytes of index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ERROR_PREVIEW = 200
"""Characters of a session's error the list shows (the session page shows all of it)."""


@dataclass(slots=True)
class ChainStart:
    """How a chain after the first began: a prefix break (``trajectory.metadata["breaks"]``, docs/builders.md)."""

    cause: str
    closest_chain: int | None = None
    common_prefix: int | None = None
    closest_prompt_tokens: int | None = None
    completion_index: int | None = None
    first_difference: int | None = None
    """Where the new prompt departs from the closest chain's last prompt + sampled ids (absent in older results)."""
    expected_ids: list[int] | None = None
    found_ids: list[int] | None = None


@dataclass(slots=True)
class ChainView:
    """One trace as drawn: its token stream and the messages beside it."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None = None
    tokens: list[str | None] | None = None
    """Each response token's text where known (the backend's ``token``; a tokenizer's for the rest), else None."""
    prompt_tokens: list[str] | None = None
    """The prompt's token texts, only when a tokenizer was given."""
    prompt_messages: list[dict[str, Any]] = field(default_factory=list)
    response_messages: list[dict[str, Any]] = field(default_factory=list)
    tools: int = 0
    role: str | None = None
    role_reason: str | None = None
    trainable: bool = True
    context_exact: bool = True
    reward: float | None = None
    finish_reason: str | None = None
    start: ChainStart | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    def detail(self) -> dict[str, Any]:
        start = self.start
        return {
            "role": self.role, "why": self.role_reason, "trainable": self.trainable, "exact": self.context_exact,
            "reward": self.reward,
            "finish": self.finish_reason, "tools": self.tools, "pids": self.prompt_ids, "ptok": self.prompt_tokens,
            "ids": self.response_ids, "mask": "".join("1" if m else "0" for m in self.loss_mask),
            "lp": self.logprobs, "tok": self.tokens, "pm": self.prompt_messages, "rm": self.response_messages,
            "start": None if start is None else {"cause": start.cause, "from": start.closest_chain,
                                                 "shared": start.common_prefix, "of": start.closest_prompt_tokens,
                                                 "completion": start.completion_index, "at": start.first_difference,
                                                 "expected": start.expected_ids, "found": start.found_ids},
            "meta": self.metadata,
        }  # fmt: skip


@dataclass(slots=True)
class SessionView:
    """One session: the list's row and the session page's content."""

    session_id: str
    status: str
    task_id: str | None = None
    sample_index: int = 0
    reward: float | None = None
    harness: str | None = None
    model: str | None = None
    completions: int = 0
    error: str | None = None
    accepted: bool | None = None
    evaluation: dict[str, Any] | None = None
    """The evaluator's report (``metadata["evaluation"]``): exit codes, test statuses, output tails."""
    metadata: dict[str, Any] = field(default_factory=dict)
    trajectory_metadata: dict[str, Any] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    harness_stderr: str | None = None
    split: str | None = None
    chains: list[ChainView] = field(default_factory=list)

    @property
    def trainable_tokens(self) -> int:
        return sum(c.trainable_tokens for c in self.chains if c.trainable)

    def index_row(self, position: int) -> dict[str, Any]:
        error = self.error if self.error is None or len(self.error) <= ERROR_PREVIEW else self.error[:ERROR_PREVIEW]
        return {"i": position, "id": self.session_id, "task": self.task_id, "st": self.status, "r": self.reward,
                "h": self.harness, "m": self.model, "c": self.completions, "ch": len(self.chains),
                "tt": self.trainable_tokens, "err": error, "acc": self.accepted}  # fmt: skip

    def detail(self) -> dict[str, Any]:
        return {
            "id": self.session_id, "task": self.task_id, "sample": self.sample_index, "status": self.status,
            "reward": self.reward, "harness": self.harness, "model": self.model, "completions": self.completions,
            "error": self.error, "accepted": self.accepted, "evaluation": self.evaluation, "meta": self.metadata,
            "tmeta": self.trajectory_metadata, "stages": self.stage_seconds, "stderr": self.harness_stderr,
            "split": self.split, "traces": [c.detail() for c in self.chains],
        }  # fmt: skip


@dataclass(slots=True)
class ViewData:
    """Everything one page shows: the sessions, and what they were read from."""

    source: str
    kind: str
    """``results`` (a ``polar run --out`` JSONL), ``generate`` (a ``polar generate`` folder), ``dataset`` (a
    ``polar export`` folder), ``serve`` (a ``polar serve`` data dir), ``status`` (a ``polar status TASK --json``
    file) or ``server`` (tasks on a running server)."""
    sessions: list[SessionView] = field(default_factory=list)
