"""Slime (THUDM/slime): traces to ``slime.utils.types.Sample`` fields.

Slime trains several samples per session, so every trainable trace is a sample by default (``traces="each"``). Slime
is not on PyPI (the PyPI ``slime`` is another project): the field names follow ``Sample`` in the slime repository
(docs/trainers.md says which version), and :meth:`SlimeSample.to_native` imports it only when called.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from polar_cli.extras import require
from polar_cli.models import Trace, TrajectoryStatus
from polar_cli.trainers.advantages import AdvantageConfig, with_advantages
from polar_cli.trainers.rules import (
    Groups,
    SampleStatus,
    Source,
    TraceRule,
    TraceSample,
    as_groups,
    message_text,
    samples,
    trace_sample,
)


@dataclass
class SlimeSample:
    """The fields of Slime's ``Sample`` that Polar fills, under Slime's names. ``status`` is the name of a
    ``Sample.Status`` member; ``tokens`` is prompt + response; ``loss_mask`` and ``rollout_log_probs`` cover the
    response."""

    group_index: int | None
    index: int | None
    prompt: str | list[dict[str, Any]]
    tokens: list[int]
    response: str
    response_length: int
    reward: float | None
    loss_mask: list[int]
    rollout_log_probs: list[float]
    status: SampleStatus
    label: str | None = None
    remove_sample: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    weight_versions: list[str] = field(default_factory=list)

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``Sample(...)``, ``status`` still a name (``Sample.Status[name]`` makes it the
        member; :meth:`to_native` does)."""
        return asdict(self)

    def to_native(self) -> Any:
        """A real ``slime.utils.types.Sample`` (imports slime: install it from its repository)."""
        types = require("slime.utils.types", needed_by="SlimeSample.to_native", distribution="slime",
                        extra="", also=" (Slime is not on PyPI: install it from github.com/THUDM/slime)")  # fmt: skip
        kwargs = self.to_kwargs()
        kwargs["status"] = types.Sample.Status[self.status]
        return types.Sample(**kwargs)


def _slime(sample: TraceSample, *, group_index: int | None, index: int | None) -> SlimeSample:
    trace = sample.trace
    versions = trace.policy_versions.per_completion if trace.policy_versions else []
    return SlimeSample(
        group_index=group_index,
        index=index,
        prompt=trace.prompt_messages,
        tokens=[*trace.prompt_ids, *trace.response_ids],
        response=message_text(trace.response_messages),
        response_length=len(trace.response_ids),
        reward=sample.reward,
        loss_mask=sample.loss_mask,
        rollout_log_probs=sample.logprobs,
        status=sample.status,
        metadata={**trace.metadata, "polar": sample.polar_fields()},
        session_id=sample.session_id,
        weight_versions=[str(v) for v in versions if v is not None],
    )


def slime_sample(trace: Trace, *, session_status: TrajectoryStatus = "completed", group_index: int | None = None,
                 index: int | None = None) -> SlimeSample:  # fmt: skip
    """One trainable trace of a session that ended ``session_status`` as a Slime sample."""
    return _slime(trace_sample(trace, session_status=session_status), group_index=group_index, index=index)


def slime_samples(
    source: Source, *, group_index: int | None = None, start_index: int = 0, traces: TraceRule = "each"
) -> list[SlimeSample]:
    """The Slime samples of a group or of a task's sessions: its trainable traces (``traces`` picks which), session by
    session in sample order, ``index`` counting from ``start_index``. A stale, cancelled or no_model_call session
    gives none."""
    out: list[SlimeSample] = []
    for each in samples(source, traces):
        out.append(_slime(each, group_index=group_index, index=start_index + len(out)))
    return out


def slime_groups(
    groups: Groups, *, traces: TraceRule = "each", advantages: AdvantageConfig | None = None
) -> list[list[SlimeSample]]:
    """Several groups (e.g. one rollout step), as Slime's rollout returns them: one list of samples per group,
    ``group_index`` the group's position and ``index`` counting across all of them. One group alone (a Group, or a
    task's SessionResults) is a list of one. ``advantages``: each sample's advantage
    (:mod:`polar_cli.trainers.advantages`) in ``metadata["polar"]["advantage"]``; ``reward`` stays the recorded
    reward."""
    batch = [samples(source, traces) for source in as_groups(groups, adapter="slime_groups")]
    out: list[list[SlimeSample]] = []
    count = 0
    for group_index, group in enumerate(with_advantages(batch, advantages)):
        out.append([_slime(each, group_index=group_index, index=count + i) for i, each in enumerate(group)])
        count += len(out[-1])
    return out
