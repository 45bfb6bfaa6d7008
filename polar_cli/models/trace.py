"""Trainer-facing results: traces (paper appendix A.4) and trajectories."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, model_validator, with_config
from typing_extensions import TypedDict  # pydantic needs typing_extensions' TypedDict on Python < 3.12

from polar_cli.models.inference import VersionSpan


@with_config(ConfigDict(extra="forbid"))
class TokenLogprob(TypedDict):
    """One ``response_logprobs`` entry, aligned with ``response_ids``: a plain dict, as in the paper's appendix A.4
    (``{"token": "The", "token_id": 785, "logprob": -0.21}``). Every entry of a Trace has all three keys: ``token``
    is None where no text is known (mask-0 tokens, and sampled ones whose backend gave no text); an entry read without
    it (the paper's own example omits it for mask-0 tokens) gets ``"token": None`` when the Trace is validated.

    A TypedDict, not a model: a trace holds one entry per response token (tens of thousands), and dicts validate about
    five times faster than model instances and need no conversion on the way to a trainer or a dataset.
    """

    token: NotRequired[str | None]
    token_id: int
    logprob: float


class PolicyVersions(BaseModel):
    """The policy versions of the completions a trace was built from (each recorded its own, see Completion): what a
    trainer bounds or corrects staleness with. A completion that crossed a weight update counts with every version of
    its ``version_spans`` in ``oldest``/``newest``."""

    model_config = ConfigDict(extra="forbid")

    oldest: int
    newest: int
    per_completion: list[int | None] = Field(
        description="each completion's version, in the trace's order (the first span's when it crossed an update; "
        "None where a completion recorded none)"
    )
    spans: list[VersionSpan] | None = Field(
        default=None,
        description="only when the trace's tokens come from more than one version: from which response token "
        "(index into response_ids) on which version sampled them (mask-0 tokens lie in the span before them; start "
        "None where the completion could not tell where the update fell)",
    )


TokenVersion = int | None | tuple[int, ...]
"""A response token's policy version: None where none was recorded, a tuple of candidates where a call crossed a
weight update at a token nobody could tell."""


def token_versions(trace: Trace) -> list[TokenVersion]:
    """Each response token's policy version, from ``trace.policy_versions`` (its ``spans`` where it has them)."""
    n = len(trace.response_ids)
    pv = trace.policy_versions
    if pv is None:
        return [None] * n
    if not pv.spans:
        return [pv.oldest] * n
    spans = pv.spans
    out: list[TokenVersion] = [tuple(s.version for s in spans)] * n  # no known start at all: any of them
    starts = [i for i, s in enumerate(spans) if s.start is not None]
    for k, i in enumerate(starts):
        nxt = starts[k + 1] if k + 1 < len(starts) else len(spans)
        begin, end = spans[i].start or 0, spans[nxt].start if nxt < len(spans) else n
        candidates = tuple(s.version for s in spans[i:nxt])
        value: TokenVersion = candidates[0] if len(candidates) == 1 else candidates
        for j in range(min(begin, n), min(end or 0, n)):
            out[j] = value
    if starts:
        before = tuple(s.version for s in spans[: starts[0]]) or (spans[0].version,)
        for j in range(min(spans[starts[0]].start or 0, n)):
            out[j] = before if len(before) > 1 else before[0]
    return out[:n]


ChainRole = Literal["main", "subagent", "side"]
"""Who a trace's tokens served (docs/builders.md, "Chain roles"): ``main`` the session's own conversation,
``subagent`` a conversation the main agent started to do part of the task (a Task/sub-agent tool), ``side`` calls the
harness makes for itself (a title, a memory or summary agent), which the task's outcome does not judge."""

RewardAssignment = Literal["main", "main+subagents", "all"]
"""Which traces of a session receive its reward (``EvaluatorSpec.reward_to``); the others keep ``reward`` None and
``trainable`` False."""


class Trace(BaseModel):
    """One training sequence: prompt, response tokens and a loss mask over them.

    Invariant: each token with ``loss_mask`` 1 was sampled by the behavior policy, with its sampled logprob.
    """

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[TokenLogprob] | None = None
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    response_messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    policy_versions: PolicyVersions | None = None
    """The versions its completions were sampled under; None when none recorded one (e.g. traces of older Polar)."""
    role: ChainRole | None = None
    """Whose tokens these are; None on traces built before roles existed."""
    role_reason: str | None = None
    """The evidence the role was decided on, in words (e.g. "the session's first chain", "a title call")."""
    trainable: bool = True
    """False when the task's reward assignment gives this trace no reward (by default: ``side`` traces): kept for
    inspection, but a trainer adapter must not train on it."""
    context_exact: bool = True
    """False when some of its sampled tokens sit in a context other than the prompt they were sampled under (built
    with ``prefix_merging``'s ``merge: prompt_prefix``, where the chat template re-rendered an earlier turn otherwise
    than sampled; ``metadata["context_exact"]`` says which completions): a trainer's recomputed logprobs on it are
    not those of the behaviour policy. Traces built before the flag existed read back True, whatever rule built
    them."""

    @model_validator(mode="after")
    def _invariants(self) -> Trace:
        n = len(self.response_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} response_ids")
        bad = next((m for m in self.loss_mask if m not in (0, 1)), None)
        if bad is not None:
            raise ValueError(f"loss_mask values must be 0 or 1, got {bad!r}")
        if self.response_logprobs is not None:
            if len(self.response_logprobs) != n:
                raise ValueError(f"response_logprobs has {len(self.response_logprobs)} entries for {n} response_ids")
            entries = self.response_logprobs
            for i, (entry, token_id) in enumerate(zip(entries, self.response_ids, strict=True)):
                if entry["token_id"] != token_id:
                    raise ValueError(
                        f"response_logprobs[{i}].token_id is {entry['token_id']}, response_ids[{i}] is {token_id}"
                    )
                if "token" not in entry:  # one shape for every entry (validation made these dicts: ours to replace)
                    entries[i] = {"token": None, "token_id": token_id, "logprob": entry["logprob"]}
        return self

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)


TrajectoryStatus = Literal["completed", "timeout", "error", "cancelled", "stale", "no_model_call", "limit"]
"""How a session ended. ``stale``: cancelled because its oldest completion fell more than the task's
``max_staleness`` versions behind the current policy version (or by ``cancel_stale``); final, never re-dispatched,
and its partial traces are kept, as a cancelled session's are. ``no_model_call``: the harness ran (to its end, its
deadline or an error) without a single model call reaching the proxy (it bypassed the base URL, or never started):
never a training sample, and ``error`` names the cause. ``limit``: the session hit one of its task's
``agent.limits`` (too many model calls or sampled tokens, or the same output over and over); the harness was
stopped, ``error`` names the limit, and what it captured is built and evaluated, as for ``timeout``."""


class Trajectory(BaseModel):
    """Everything one session produced for training."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = None
    status: TrajectoryStatus
    traces: list[Trace] = Field(default_factory=list)
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
