"""veRL: traces to ``verl.experimental.agent_loop.agent_loop.AgentLoopOutput`` fields (veRL 0.9.1).

veRL's agent loop returns one ``AgentLoopOutput`` per sample (``AgentLoopBase.run``), and GRPO groups the batch's
rows by their ``uid``, which veRL's trainer sets per prompt. A session that split into several traces needs a rule
(:data:`~polar_cli.trainers.rules.TraceRule`): inside an agent loop, :func:`verl_output` takes one (``main`` or
``last_main``); a trainer that assembles its own batch can take ``each`` from :func:`verl_outputs`, whose rows of one
task share a ``uid`` (veRL copies ``extra_fields`` into the batch's non-tensor fields). veRL has no status field:
FAILED samples get a zero mask, and the status is in ``extra_fields["polar"]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from polar_cli.errors import AdapterError
from polar_cli.extras import require
from polar_cli.models import SessionResult, Trace, TrajectoryStatus
from polar_cli.trainers.advantages import AdvantageConfig, with_advantages
from polar_cli.trainers.rules import Groups, TraceRule, TraceSample, as_groups, samples, session_samples, trace_sample


@dataclass
class VerlAgentLoopMetrics:
    """``AgentLoopMetrics``'s fields (seconds; -1: not available). Polar measures none of them per trace."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


@dataclass
class VerlAgentLoopOutput:
    """The fields of veRL's ``AgentLoopOutput`` that Polar fills, under veRL's names. ``response_mask`` is the loss
    mask (1 model token, 0 tool/interstitial); ``response_logprobs`` one float per response token (0.0 where the mask
    is 0)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward_score: float | None
    num_turns: int
    metrics: VerlAgentLoopMetrics = field(default_factory=VerlAgentLoopMetrics)
    extra_fields: dict[str, Any] = field(default_factory=dict)

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``AgentLoopOutput(...)`` (``metrics`` a dict, which pydantic validates into
        ``AgentLoopMetrics``)."""
        return asdict(self)

    def to_native(self) -> Any:
        """A real ``AgentLoopOutput`` (imports veRL)."""
        module = require("verl.experimental.agent_loop.agent_loop", needed_by="VerlAgentLoopOutput.to_native",
                         distribution="verl", extra="")  # fmt: skip
        return module.AgentLoopOutput(**self.to_kwargs())


def _verl(sample: TraceSample, uid: str | None) -> VerlAgentLoopOutput:
    trace = sample.trace
    extra: dict[str, Any] = {"polar": sample.polar_fields()}
    if uid is not None:
        extra["uid"] = uid
    return VerlAgentLoopOutput(
        prompt_ids=list(trace.prompt_ids),
        response_ids=list(trace.response_ids),
        response_mask=sample.loss_mask,
        response_logprobs=sample.logprobs,
        reward_score=sample.reward,
        num_turns=len(trace.prompt_messages) + len(trace.response_messages),
        extra_fields=extra,
    )


def verl_trace_output(trace: Trace, *, session_status: TrajectoryStatus = "completed") -> VerlAgentLoopOutput:
    """One trainable trace of a session that ended ``session_status`` as veRL's agent-loop output."""
    return _verl(trace_sample(trace, session_status=session_status), None)


def verl_output(result: SessionResult, *, traces: TraceRule = "main") -> VerlAgentLoopOutput:
    """The one output of a session, as ``AgentLoopBase.run`` returns it: ``traces`` must pick exactly one trace
    (``main`` or ``last_main``). A session with no sample (stale, cancelled, no_model_call, nothing trainable) or
    with several under ``traces`` is an AdapterError."""
    picked = session_samples(result, traces)
    if len(picked) != 1:
        why = f"status {result.status}" if not picked else f"traces={traces!r} picked {len(picked)} traces"
        raise AdapterError(f"session {result.session_id}: no single veRL output ({why}); an agent loop returns one")
    return _verl(picked[0], None)


def verl_outputs(
    groups: Groups, *, traces: TraceRule = "main", advantages: AdvantageConfig | None = None
) -> list[VerlAgentLoopOutput]:
    """The outputs of several groups (e.g. one rollout step; as ``slime_groups`` and ``trl_rollout`` take them), one
    flat batch: group by group, session by session in sample order, each with ``extra_fields["uid"]``: its group's
    ``group_id`` (else the task id), so GRPO groups each group's rows together. One group alone (a Group, or a task's
    SessionResults) works too. ``advantages``: each row's advantage (:mod:`polar_cli.trainers.advantages`) in
    ``extra_fields["polar"]["advantage"]``, for a custom veRL advantage estimator; ``reward_score`` stays the
    recorded reward."""
    batch = [samples(source, traces) for source in as_groups(groups, adapter="verl_outputs")]
    out = []
    for group in with_advantages(batch, advantages):
        for sample in group:
            uid = sample.group_id if sample.group_id is not None else sample.task_id
            out.append(_verl(sample, None if uid is None else str(uid)))
    return out
