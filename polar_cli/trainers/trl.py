"""TRL: groups to what ``GRPOTrainer(rollout_func=...)`` expects back (TRL 1.16, experimental there).

How TRL 1.16 calls it (``GRPOTrainer._generate``): ``rollout_func(prompts, trainer)`` gets this process's prompts with
each prompt repeated ``num_generations`` times in a row (the trainer's ``RepeatSampler``), and must return a dict of
lists, one entry per received prompt in the same order: ``prompt_ids``, ``completion_ids``, ``logprobs`` (required),
``env_mask`` (optional: 1 model token, 0 external; it becomes the loss mask) and any other key, which TRL copies into
each row's inputs and hands to the reward functions as a keyword argument. Rewards are computed by ``reward_funcs``
and normalized per run of ``num_generations`` rows, so each group must give exactly ``num_generations`` samples, in a
row. The logprobs enter the loss only with vLLM importance-sampling correction.

Polar's output adds ``polar_reward`` (each sample's ``Trace.reward``; None where it has none, which TRL treats as
unscorable) for :func:`polar_reward_func`, and ``polar_session_id`` / ``polar_status`` / ``polar_context_exact``
(``Trace.context_exact``), ``polar_token_versions`` (the policy version of each completion token, for an importance
correction of tokens an older policy sampled), and ``polar_advantage`` (None unless asked for, ``advantages=``) for
:func:`polar_advantage_func`. TRL has no status field: FAILED samples get a zero ``env_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from polar_cli.errors import AdapterError
from polar_cli.trainers.advantages import AdvantageConfig, with_advantages
from polar_cli.trainers.rules import Groups, SampleStatus, TraceRule, as_groups, samples, token_versions


@dataclass
class TrlRolloutOutput:
    """The dict ``rollout_func`` returns, under TRL's keys (one entry per completion) plus Polar's extra fields."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    env_mask: list[list[int]] = field(default_factory=list)
    polar_reward: list[float | None] = field(default_factory=list)
    polar_session_id: list[str | None] = field(default_factory=list)
    polar_status: list[SampleStatus] = field(default_factory=list)
    polar_context_exact: list[bool] = field(default_factory=list)
    polar_advantage: list[float | None] = field(default_factory=list)
    polar_token_versions: list[list[int | None]] = field(default_factory=list)

    def to_kwargs(self) -> dict[str, Any]:
        """What ``rollout_func`` returns."""
        return asdict(self)

    def __len__(self) -> int:
        return len(self.completion_ids)


def trl_rollout(
    groups: Groups, *, num_generations: int, traces: TraceRule = "main", advantages: AdvantageConfig | None = None
) -> TrlRolloutOutput:
    """The rollout of several groups, one per distinct prompt in TRL's order: each must give exactly
    ``num_generations`` samples (one per session under ``main`` / ``last_main``; ``each`` only fits when the counts
    still match). A group that gives another count, or a sample without response tokens, is an AdapterError.
    ``advantages``: each sample's advantage (:mod:`polar_cli.trainers.advantages`) in ``polar_advantage``, for
    :func:`polar_advantage_func`."""
    sources = as_groups(groups, adapter="trl_rollout")
    batch = [samples(source, traces) for source in sources]
    for position, (source, picked) in enumerate(zip(sources, batch, strict=True)):
        if len(picked) != num_generations:
            name = getattr(source, "task_id", None) or f"at position {position}"
            raise AdapterError(
                f"group {name}: {len(picked)} samples under traces={traces!r}, but TRL's GRPOTrainer needs exactly "
                f"num_generations={num_generations} per prompt (sessions that gave no sample: stale, cancelled, "
                "no_model_call, nothing trainable, or dropped from a Group)"
            )
    out = TrlRolloutOutput()
    for picked in with_advantages(batch, advantages):
        for sample in picked:
            if not sample.trace.response_ids:
                raise AdapterError(f"session {sample.session_id}: trace {sample.trace_index} has no response token")
            out.prompt_ids.append(list(sample.trace.prompt_ids))
            out.completion_ids.append(list(sample.trace.response_ids))
            out.logprobs.append(sample.logprobs)
            out.env_mask.append(sample.loss_mask)
            out.polar_reward.append(sample.reward)
            out.polar_session_id.append(sample.session_id)
            out.polar_status.append(sample.status)
            out.polar_context_exact.append(sample.trace.context_exact)
            out.polar_advantage.append(sample.advantage)
            out.polar_token_versions.append(token_versions(sample.trace))
    return out


def distinct_prompts(prompts: Sequence[Any], num_generations: int) -> list[Any]:
    """The prompts ``rollout_func`` received, each once: TRL repeats each ``num_generations`` times in a row. Prompts
    that do not come in such runs are an AdapterError."""
    if num_generations < 1 or len(prompts) % num_generations:
        raise AdapterError(f"{len(prompts)} prompts do not come in runs of num_generations={num_generations}")
    firsts = list(prompts[::num_generations])
    for i, first in enumerate(firsts):
        run = prompts[i * num_generations : (i + 1) * num_generations]
        if any(p != first for p in run):
            raise AdapterError(f"prompts {i * num_generations}..: not one prompt repeated {num_generations} times")
    return firsts


def polar_reward_func(completions: list[Any], polar_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """A TRL reward function returning Polar's rewards (the ``polar_reward`` field of :func:`trl_rollout`'s output):
    pass it in ``reward_funcs``."""
    return list(polar_reward)


def polar_advantage_func(
    completions: list[Any], polar_advantage: list[float | None], **kwargs: Any
) -> list[float | None]:
    """A TRL reward function returning the advantages Polar computed (``trl_rollout(..., advantages=...)``): pass it
    as the only entry of ``reward_funcs`` with ``GRPOConfig(scale_rewards="none")``. TRL 1.16 then takes each
    reward minus its group's mean as the advantage; Polar's GRPO, Dr. GRPO and RLOO advantages have group mean 0, so
    they reach the loss unchanged (after task normalization, TRL's group centring undoes the per-family shift and
    keeps the per-family scale)."""
    return list(polar_advantage)
