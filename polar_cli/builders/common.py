"""Pieces both built-in builders share: input checks, trace metadata and logprob entries."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from polar_cli.builders.config import BuilderConfig
from polar_cli.errors import BuildError
from polar_cli.interfaces.builder import BuildContext
from polar_cli.interfaces.harness import RoleVerdict
from polar_cli.models import Completion, PolicyVersions, TokenLogprob, Trace, Trajectory, TrajectoryStatus
from polar_cli.models.completion import ABORTED
from polar_cli.models.inference import VersionSpan

PLACEHOLDER_LOGPROB = 0.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building.

    Building allocates many small acyclic objects (logprob entries, slices); each collection they trigger walks every
    token list of the session, millions of references, which made a 32K-token session several times slower.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def ordered_completions(completions: Sequence[Completion], config: BuilderConfig, builder: str) -> list[Completion]:
    """The session's completions in capture order, after refusing what an RL builder must not use. Aborted calls
    (the client left mid-stream; ``finish_reason == "abort"``) are dropped: a partial answer nobody read is no
    training data."""
    ordered = sorted((c for c in completions if c.finish_reason != ABORTED), key=lambda c: c.index)
    sessions = {c.session_id for c in ordered}
    if len(sessions) > 1:
        raise BuildError(f"builder {builder!r} got completions of {len(sessions)} sessions: {sorted(sessions)}")
    if not config.allow_retokenized:
        bad = [c for c in ordered if c.token_source == "retokenized"]
        if bad:
            first = bad[0]
            raise BuildError(
                f"builder {builder!r}: {len(bad)} completion(s) carry token ids re-tokenized locally from text "
                f"(first: {first.completion_id!r}, index {first.index}), not the ids the inference backend "
                "sampled; training on them would be off-policy in ways no importance ratio can see. Configure "
                "the backend to return token ids, or pass allow_retokenized=True (e.g. for offline SFT data)."
            )
    return ordered


def base_metadata(context: BuildContext, completions: Sequence[Completion], builder: str) -> dict[str, Any]:
    """Trace metadata common to one session: task metadata first, then the ids that must not be overridden.

    Values come from the build context; missing ones from the first completion (``session_id`` and the
    ``task_id``/``harness``/``task_metadata`` keys of its ``metadata``).
    """
    first_meta = completions[0].metadata if completions else {}
    task_metadata = context.task_metadata or first_meta.get("task_metadata") or {}
    return {
        **(task_metadata if isinstance(task_metadata, Mapping) else {}),
        "session_id": context.session_id or (completions[0].session_id if completions else None),
        "task_id": context.task_id or first_meta.get("task_id"),
        "builder": builder,
        "harness": context.harness or first_meta.get("harness"),
    }


def sampled_entries(completion: Completion) -> list[TokenLogprob]:
    """``response_logprobs`` entries for a completion's sampled tokens: ``token`` is the text the backend gave for
    it, or None when it gave none (every entry has the same three keys); requires its logprobs."""
    logprobs = completion.response_logprobs
    assert logprobs is not None
    ids = completion.response_ids
    if completion.response_tokens is None:
        return [{"token": None, "token_id": i, "logprob": lp} for i, lp in zip(ids, logprobs, strict=True)]
    return [
        {"token": t, "token_id": i, "logprob": lp}
        for t, i, lp in zip(completion.response_tokens, ids, logprobs, strict=True)
    ]


def placeholder_entries(token_ids: Sequence[int]) -> list[TokenLogprob]:
    """Entries for mask-0 tokens, so the list stays aligned: the same keys as sampled ones, ``token`` None (a prompt's
    ids come without text) and a placeholder logprob."""
    return [{"token": None, "token_id": i, "logprob": PLACEHOLDER_LOGPROB} for i in token_ids]


def completion_versions(completion: Completion) -> list[VersionSpan]:
    """The version spans of one completion's sampled tokens (its own ``version_spans``, else one span of its
    ``policy_version``; none when it recorded no version)."""
    if completion.version_spans:
        return list(completion.version_spans)
    if completion.policy_version is None:
        return []
    return [VersionSpan(start=0, version=completion.policy_version)]


def policy_versions(members: Sequence[Completion], starts: Sequence[int]) -> PolicyVersions | None:
    """The versions of a trace made of ``members``, whose sampled tokens begin at ``starts`` in its
    ``response_ids``; None when no member recorded a version. Spans (in the trace's positions) are given when the
    trace mixes versions and every member recorded one."""
    spans: list[VersionSpan] = []
    versions: set[int] = set()
    complete = True
    for completion, start in zip(members, starts, strict=True):
        own = completion_versions(completion)
        complete = complete and bool(own)
        versions.update(span.version for span in own)
        for span in own:
            at = None if span.start is None else start + span.start  # None: where the update fell is unknown
            while at is not None and spans and (spans[-1].start or 0) >= at:  # an empty response's: no token
                spans.pop()
            if not spans or spans[-1].version != span.version:
                spans.append(VersionSpan(start=at, version=span.version))
    if not versions:
        return None
    return PolicyVersions(
        oldest=min(versions),
        newest=max(versions),
        per_completion=[c.policy_version for c in members],
        spans=spans if complete and len({s.version for s in spans}) > 1 else None,
    )


def make_trace(
    *,
    prompt_ids: list[int],
    response_ids: list[int],
    loss_mask: list[int],
    entries: list[TokenLogprob] | None,
    prompt_messages: list[dict[str, Any]],
    response_messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    finish_reason: str | None,
    metadata: dict[str, Any],
    versions: PolicyVersions | None = None,
    role: RoleVerdict | None = None,
    context_exact: bool = True,
) -> Trace:
    """A Trace from trusted, builder-made parts.

    The Trace is constructed without validation (the entries are dicts the builder made, and its per-token invariant
    loop would cost more than the build): builders satisfy the invariants by construction, ``verify`` checks them
    independently, and a Trace read back from JSON is validated in full.
    """
    if not (len(response_ids) == len(loss_mask) and (entries is None or len(entries) == len(response_ids))):
        raise BuildError("internal error: trace parts are not aligned")  # pragma: no cover - a builder bug
    return Trace.model_construct(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        loss_mask=loss_mask,
        response_logprobs=entries,
        prompt_messages=prompt_messages,
        response_messages=response_messages,
        tools=tools,
        finish_reason=finish_reason,
        reward=None,
        metadata=metadata,
        policy_versions=versions,
        role=role.role if role is not None else None,
        role_reason=role.reason if role is not None else None,
        trainable=True,
        context_exact=context_exact,
    )


def finish(session_id: str | None, status: TrajectoryStatus, traces: list[Trace], stats: dict[str, Any]) -> Trajectory:
    """The trajectory, constructed without re-running each trace's per-token validator (see ``make_trace``)."""
    return Trajectory.model_construct(
        session_id=session_id, status=status, traces=traces, reward=None, metadata=stats, error=None
    )
