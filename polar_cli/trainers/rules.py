"""What every trainer adapter shares: which traces of a session are samples, their status, mask and flat logprobs.

The rules (docs/trainers.md, TRAINERS.md):

- A session's samples are its **trainable** traces (``Trace.trainable``; the task's reward assignment decides which,
  and ``Trace.reward`` is each one's reward, None kept as None). Which of them, for trainers that take one sequence
  per rollout, is a :data:`TraceRule`.
- Status, from the session's status and the trace's finish reason: ``completed`` -> COMPLETED (``length`` ->
  TRUNCATED), ``timeout`` and ``limit`` -> ABORTED, ``error`` -> FAILED with the loss mask zeroed; ``stale``,
  ``cancelled`` and ``no_model_call`` sessions give no sample.
- Logprobs: one float per response token; mask-0 tokens get 0.0, and a mask-1 token without a finite logprob is a
  :class:`~polar_cli.errors.MissingLogprobError` naming the session and the position.
- Context: ``Trace.context_exact`` goes with every sample (false for a trace built with ``merge: prompt_prefix``
  whose later turns sit in a re-rendered context: recomputed logprobs there are not the behaviour policy's), where
  each trainer keeps per-sample extras.
- Versions: each sample carries its completions' policy versions (``policy_versions``) and one version per response
  token (:func:`token_versions`), beside the recorded logprobs: what a trainer needs to correct the importance ratio
  of tokens sampled by an older policy (TIS), e.g. under cross-policy sampling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from polar_cli.errors import AdapterError, MissingLogprobError
from polar_cli.groups import Group
from polar_cli.models import SessionResult, Trace, TrajectoryStatus
from polar_cli.models.trace import token_versions as recorded_versions

SampleStatus = Literal["COMPLETED", "TRUNCATED", "ABORTED", "FAILED"]
"""Slime's ``Sample.Status`` names; veRL and TRL have no status field and get it as extra data."""

TraceRule = Literal["main", "last_main", "each"]
"""Which trainable traces of a session become samples:

- ``main``: exactly one, the session's trace with role ``main``. Several main traces (compaction split the main
  conversation, or the ``per_request`` builder made one trace per call) are an AdapterError naming the session: choose
  ``last_main`` or ``each``. A session whose traces carry no role (built before roles existed) counts when it has one
  trainable trace.
- ``last_main``: the last trainable main trace (the one that reached the session's end); earlier main traces and
  sub-agent traces are not trained.
- ``each``: every trainable trace is its own sample, in trace order, all with the session's group.
"""

NOT_A_SAMPLE: frozenset[str] = frozenset({"stale", "cancelled", "no_model_call"})
"""Session statuses that give no sample: sampled under a policy the trainer left behind, stopped, or nothing
captured."""

Source = Group | SessionResult | Sequence[SessionResult]
"""What the session-level adapters take: a usable Group (its ``results``, already judged: dropped sessions stay out),
one SessionResult, or the SessionResults of a task (``TaskStatus.results``; every status is mapped)."""

Groups = Sequence[Source] | Source
"""What the adapters of several groups take (``slime_groups``, ``verl_outputs``, ``trl_rollout``): a list of groups,
each a :data:`Source`; or one group on its own (a Group, or one task's SessionResults)."""


@dataclass(frozen=True)
class TraceSample:
    """One trace made ready for any trainer: the fields the three adapters map to their own names."""

    trace: Trace
    status: SampleStatus
    session_status: TrajectoryStatus
    loss_mask: list[int]
    """The trace's mask, all zeros when the session failed (FAILED)."""
    logprobs: list[float]
    """One float per response token; 0.0 where ``loss_mask`` is 0."""
    reward: float | None
    session_id: str | None
    task_id: str | None
    sample_index: int
    trace_index: int
    """The trace's position in its session's trajectory."""
    session_reward: float | None = None
    """The session's reward (``SessionResult.reward``; for a trace alone, its own): what advantages are computed
    from (:mod:`polar_cli.trainers.advantages`)."""
    advantage: float | None = None
    """Its advantage, when an adapter was asked for them (``advantages=``); else None."""

    @property
    def group_id(self) -> Any:
        return self.trace.metadata.get("group_id")

    def polar_fields(self) -> dict[str, Any]:
        """Where the sample came from, for a trainer's metadata / extra fields."""
        return {
            "session_id": self.session_id,
            "task_id": self.task_id,
            "sample_index": self.sample_index,
            "trace_index": self.trace_index,
            "role": self.trace.role,
            "session_status": self.session_status,
            "status": self.status,
            "group_id": self.group_id,
            "context_exact": self.trace.context_exact,
            "advantage": self.advantage,
            "policy_versions": self.trace.policy_versions.per_completion if self.trace.policy_versions else [],
            "token_versions": token_versions(self.trace),
        }


def token_versions(trace: Trace) -> list[int | None]:
    """The policy version that sampled each response token (mask-0 tokens get the version of the stretch they lie
    in), from ``trace.policy_versions``: None where it cannot be told (no versions recorded, or the stretch in which
    an update fell at a token nobody could tell, where :func:`polar_cli.models.trace.token_versions` lists the
    candidates)."""
    return [None if isinstance(v, tuple) else v for v in recorded_versions(trace)]


def sample_status(session_status: TrajectoryStatus, finish_reason: str | None) -> SampleStatus | None:
    """The status of a trace of a session that ended ``session_status``; None: not a sample."""
    if session_status in NOT_A_SAMPLE:
        return None
    if session_status in ("timeout", "limit"):
        return "ABORTED"
    if session_status == "error":
        return "FAILED"
    return "TRUNCATED" if finish_reason == "length" else "COMPLETED"


def flat_logprobs(
    trace: Trace, loss_mask: Sequence[int] | None = None, *, session_id: str | None = None
) -> list[float]:
    """``trace``'s response logprobs as floats aligned with ``response_ids``: 0.0 where ``loss_mask`` (default: the
    trace's) is 0; a mask-1 token without a finite logprob is a MissingLogprobError."""
    mask = trace.loss_mask if loss_mask is None else loss_mask
    entries = trace.response_logprobs
    where = session_id or trace.metadata.get("session_id") or "?"
    if entries is None:
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is not None:
            raise MissingLogprobError(
                f"session {where}: response token {first} (id {trace.response_ids[first]}) has loss_mask 1 but the "
                f"trace has no response_logprobs"
            )
        return [0.0] * len(trace.response_ids)
    out = []
    for i, (m, entry) in enumerate(zip(mask, entries, strict=True)):
        if not m:
            out.append(0.0)
            continue
        value = entry.get("logprob")
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise MissingLogprobError(
                f"session {where}: response token {i} (id {trace.response_ids[i]}) has loss_mask 1 but logprob "
                f"{value!r}"
            )
        out.append(float(value))
    return out


def trace_sample(
    trace: Trace,
    *,
    session_status: TrajectoryStatus = "completed",
    session_id: str | None = None,
    task_id: str | None = None,
    sample_index: int = 0,
    trace_index: int = 0,
    session_reward: float | None = None,
) -> TraceSample:
    """``trace`` as a sample of a session that ended ``session_status``. A trace that is not trainable, or whose
    session gives no sample (stale, cancelled, no_model_call), is an AdapterError."""
    session_id = session_id or trace.metadata.get("session_id")
    task_id = task_id or trace.metadata.get("task_id")
    if not trace.trainable:
        raise AdapterError(
            f"session {session_id}: trace {trace_index} is not trainable (role {trace.role}: the task's reward "
            "assignment gives it no reward)"
        )
    status = sample_status(session_status, trace.finish_reason)
    if status is None:
        raise AdapterError(f"session {session_id}: a {session_status} session gives no training sample")
    mask = [0] * len(trace.loss_mask) if status == "FAILED" else list(trace.loss_mask)
    return TraceSample(
        trace=trace,
        status=status,
        session_status=session_status,
        loss_mask=mask,
        logprobs=flat_logprobs(trace, mask, session_id=session_id),
        reward=trace.reward,
        session_id=session_id,
        task_id=task_id,
        sample_index=sample_index,
        trace_index=trace_index,
        session_reward=trace.reward if session_reward is None else session_reward,
    )


def select_traces(result: SessionResult, rule: TraceRule = "each") -> list[tuple[int, Trace]]:
    """The trainable traces of ``result`` that ``rule`` makes samples, each with its index in the trajectory."""
    trainable = [(i, t) for i, t in enumerate(result.trajectory.traces) if t.trainable]
    if rule == "each" or not trainable:
        return trainable
    main = [(i, t) for i, t in trainable if t.role == "main"]
    if not main and all(t.role is None for _, t in trainable):
        if len(trainable) == 1:
            return trainable
        raise AdapterError(
            f"session {result.session_id}: {len(trainable)} trainable traces without roles (built before roles "
            f"existed): traces={rule!r} cannot tell the main one; use traces='each'"
        )
    if rule == "last_main":
        return main[-1:]
    if len(main) > 1:
        raise AdapterError(
            f"session {result.session_id}: {len(main)} trainable main traces (compaction, or one trace per call): "
            "traces='main' takes exactly one; use traces='last_main' or traces='each'"
        )
    return main


def session_samples(result: SessionResult, rule: TraceRule = "each") -> list[TraceSample]:
    """The samples of one session under ``rule`` (none for a stale, cancelled or no_model_call session)."""
    if result.status in NOT_A_SAMPLE:
        return []
    return [
        trace_sample(
            trace,
            session_status=result.status,
            session_id=result.session_id,
            task_id=result.task_id,
            sample_index=result.sample_index,
            trace_index=index,
            session_reward=result.reward,
        )
        for index, trace in select_traces(result, rule)
    ]


def as_groups(groups: Groups, *, adapter: str) -> list[Source]:
    """``groups`` as a list of groups: a Group, a SessionResult or a list of SessionResults alone is one group (a
    task's sessions); any other list is a list of groups. Anything else is an AdapterError naming ``adapter``."""
    if isinstance(groups, Group | SessionResult):
        return [groups]
    if isinstance(groups, str | bytes) or not isinstance(groups, Sequence):
        raise AdapterError(f"{adapter} takes a list of groups (or one group), not {type(groups).__name__}")
    items = list(groups)
    if items and all(isinstance(item, SessionResult) for item in items):
        return [items]  # type: ignore[list-item]
    for position, item in enumerate(items):
        if isinstance(item, Group | SessionResult):
            continue
        listed = isinstance(item, Sequence) and not isinstance(item, str | bytes)
        if listed and all(isinstance(r, SessionResult) for r in item):
            continue
        raise AdapterError(
            f"{adapter}: group {position} is a {type(item).__name__}; each group is a Group, a SessionResult or a list "
            "of SessionResults"
        )
    return items


def session_results(source: Source) -> list[SessionResult]:
    """The sessions of ``source``, in sample order."""
    if isinstance(source, Group):
        return list(source.results)
    if isinstance(source, SessionResult):
        return [source]
    return sorted(source, key=lambda r: (r.sample_index, r.session_id))


def samples(source: Source, rule: TraceRule = "each") -> list[TraceSample]:
    """The samples of every session of ``source``, session by session in sample order."""
    return [sample for result in session_results(source) for sample in session_samples(result, rule)]


def message_text(messages: Sequence[dict[str, Any]]) -> str:
    """The text of chat messages (string contents and text parts), joined by newlines."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(p for p in parts if p)
