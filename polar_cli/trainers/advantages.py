"""Advantages (docs/trainers.md, "Advantages and reward shaping"): group baselines and AgentRL's task normalization.

Pure numpy functions: :func:`grpo`, :func:`dr_grpo` and :func:`rloo` over one group's rewards (one per session, the
recorded reward: shaped when the task declares ``evaluator.shaping``), :func:`group_advantages` over a
:class:`~polar_cli.groups.Group`, and :func:`task_normalize` over a batch's token-level advantages. Every estimator
gives a group whose rewards are all equal (a group of one included) exactly zero advantages: no signal, and no noise
from dividing rounding errors by a tiny spread. :class:`AdvantageConfig` and :func:`sample_advantages` are what the
adapters (``verl_outputs``, ``slime_groups``, ``trl_rollout``) use when asked for advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from polar_cli.errors import ConfigError
from polar_cli.groups import Group
from polar_cli.models import StrictModel
from polar_cli.trainers.rules import TraceSample

Estimator = Literal["grpo", "dr_grpo", "rloo"]
DEFAULT_EPS = 1e-6
Family = str | int | float | bool
"""A task family: the value of the task metadata field :attr:`AdvantageConfig.normalize_by` names."""


def _rewards(rewards: ArrayLike) -> NDArray[np.float64]:
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"a group's rewards are one number per sample, not an array of shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"rewards must be finite, got {values.tolist()}")
    return values


def _all_equal(values: NDArray[np.float64]) -> bool:
    return values.size < 2 or bool(np.all(values == values[0]))


def grpo(rewards: ArrayLike, eps: float = DEFAULT_EPS) -> NDArray[np.float64]:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, section 4.1.2)::

        A_i = (r_i - mean(r)) / (std(r) + eps)

    ``std`` the sample standard deviation (ddof 1), as veRL's and TRL's GRPO compute it. All rewards equal, or a
    group of one: all zeros."""
    values = _rewards(rewards)
    if _all_equal(values):
        return np.zeros_like(values)
    return (values - values.mean()) / (values.std(ddof=1) + eps)


def dr_grpo(rewards: ArrayLike) -> NDArray[np.float64]:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783): mean-centred only, no
    division by the group's standard deviation (which favours groups that are nearly all right or all wrong)::

        A_i = r_i - mean(r)

    All rewards equal, or a group of one: all zeros."""
    values = _rewards(rewards)
    if _all_equal(values):
        return np.zeros_like(values)
    return values - values.mean()


def rloo(rewards: ArrayLike) -> NDArray[np.float64]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740): each
    sample's baseline is the mean of the others' rewards::

        A_i = r_i - (1 / (n - 1)) * sum_{j != i} r_j  =  n / (n - 1) * (r_i - mean(r))

    All rewards equal: all zeros. A group of one has no other sample to be its baseline: zero."""
    values = _rewards(rewards)
    if _all_equal(values):
        return np.zeros_like(values)
    n = values.size
    return (values - (values.sum() - values) / (n - 1)).astype(np.float64)


def estimate(rewards: ArrayLike, estimator: Estimator = "grpo", eps: float = DEFAULT_EPS) -> NDArray[np.float64]:
    """One group's advantages by ``estimator`` (``eps`` is GRPO's)."""
    match estimator:
        case "grpo":
            return grpo(rewards, eps)
        case "dr_grpo":
            return dr_grpo(rewards)
        case "rloo":
            return rloo(rewards)


def group_advantages(group: Group, estimator: Estimator = "grpo", eps: float = DEFAULT_EPS) -> NDArray[np.float64]:
    """The advantage of each usable session of ``group`` (aligned with ``group.results`` and ``group.rewards``), by
    ``estimator``. All rewards equal, or one session: all zeros."""
    return estimate(group.rewards, estimator, eps)


def task_normalize(
    advantages: Sequence[ArrayLike], masks: Sequence[Sequence[int]], families: Sequence[Family]
) -> list[NDArray[np.float64]]:
    """AgentRL's task advantage normalization (Zhang et al. 2025, "AgentRL", arXiv 2510.04206, Eq. 1): the
    token-level advantages of a batch normalized per task family ``k`` over every mask-1 token of its samples::

        A'_{i,t} = (A_{i,t} - mean_k) / std_k

    ``mean_k`` and ``std_k`` (population, ddof 0) over the tokens ``t`` with mask 1 of the samples ``i`` of family
    ``k``, so each family's mask-1 tokens come out with mean 0 and standard deviation 1 and no task's reward scale
    dominates the batch. ``advantages[i]`` is one per response token (or one number, the sample's, for every token);
    ``masks[i]`` the sample's loss mask; ``families[i]`` its family. Mask-0 tokens come out 0. A family whose mask-1
    advantages are all equal (every group of it had equal rewards, or it has one mask-1 token) comes out all 0; so
    does a family without a mask-1 token, and one whose spread is too small for its standard deviation to be above 0
    in floating point."""
    if not len(advantages) == len(masks) == len(families):
        counts = f"{len(advantages)} advantages, {len(masks)} masks, {len(families)} families"
        raise ValueError(f"{counts}: one of each per sample")
    tokens = []
    for i, (values, mask) in enumerate(zip(advantages, masks, strict=True)):
        array = np.asarray(values, dtype=np.float64)
        array = np.full(len(mask), float(array)) if array.ndim == 0 else array
        if array.shape != (len(mask),):
            raise ValueError(f"sample {i}: {array.size} advantages for {len(mask)} mask entries")
        tokens.append(array)
    selected = [np.asarray(mask, dtype=bool) for mask in masks]
    out = [np.zeros_like(array) for array in tokens]
    for family in dict.fromkeys(families):
        members = [i for i, f in enumerate(families) if f == family]
        pooled = np.concatenate([tokens[i][selected[i]] for i in members])
        if pooled.size == 0 or bool(np.all(pooled == pooled[0])):
            continue
        mean, std = pooled.mean(), pooled.std()
        if not std > 0:  # a spread so small its square underflows: nothing to scale
            continue
        for i in members:
            out[i][selected[i]] = (tokens[i][selected[i]] - mean) / std
    return out


class AdvantageConfig(StrictModel):
    """Which advantages the adapters attach to each sample (``advantages=`` of ``verl_outputs``, ``slime_groups``,
    ``trl_rollout``)."""

    estimator: Estimator = Field(default="grpo", description="grpo, dr_grpo or rloo, over each group's sessions")
    eps: float = Field(default=DEFAULT_EPS, gt=0, description="GRPO's eps")
    normalize_by: str | None = Field(
        default=None,
        description="a task metadata field naming each task's family: the batch's advantages are then normalized per "
        "family over its mask-1 tokens (AgentRL's task advantage normalization). None: not normalized",
    )


def family_of(sample: TraceSample, field: str) -> Family:
    """The family of ``sample``: its task's ``metadata[field]``. A missing or non-scalar value is a ConfigError."""
    value = sample.trace.metadata.get(field)
    if value is None or not isinstance(value, str | int | float | bool):
        found = f"no metadata field {field!r}" if value is None else f"metadata.{field} = {value!r}"
        raise ConfigError(
            f"advantages normalize_by={field!r}: session {sample.session_id} (task {sample.task_id}) has {found}; "
            "each task names its family there, a string or a number"
        )
    return value


def _masked_value(tokens: NDArray[np.float64], mask: Sequence[int]) -> float:
    """A sample's one advantage from its normalized tokens: that of its mask-1 tokens (all alike), 0.0 without one."""
    first = next((t for t, m in enumerate(mask) if m), None)
    return 0.0 if first is None else float(tokens[first])


def sample_advantages(groups: Sequence[Sequence[TraceSample]], config: AdvantageConfig) -> list[list[float | None]]:
    """The advantage of each sample of a batch of groups (aligned with ``groups``), as the adapters attach it. The
    estimator runs over each group's sessions that have a reward (``TraceSample.session_reward``), once per session
    however many samples it gives; every sample gets its session's advantage, None when the session has no reward.
    With ``config.normalize_by``, the batch's token advantages are then normalized per family (:func:`task_normalize`
    over each sample's ``loss_mask``, a FAILED sample's all 0) and each sample gets the value of its mask-1 tokens
    (0.0 when it has none)."""
    out: list[list[float | None]] = []
    for group in groups:
        rewards: dict[tuple[str | None, int], float] = {}
        for sample in group:
            if sample.session_reward is not None:
                rewards.setdefault((sample.session_id, sample.sample_index), sample.session_reward)
        values = estimate(list(rewards.values()), config.estimator, config.eps).tolist()
        by_session = dict(zip(rewards, values, strict=True))
        out.append([by_session.get((sample.session_id, sample.sample_index)) for sample in group])
    if config.normalize_by is None:
        return out
    field = config.normalize_by
    rewarded = [(value, sample) for row, group in zip(out, groups, strict=True)
                for value, sample in zip(row, group, strict=True) if value is not None]  # fmt: skip
    normalized = task_normalize([value for value, _ in rewarded], [sample.loss_mask for _, sample in rewarded],
                                [family_of(sample, field) for _, sample in rewarded])  # fmt: skip
    scalars = iter(
        _masked_value(tokens, sample.loss_mask) for tokens, (_, sample) in zip(normalized, rewarded, strict=True)
    )
    return [[None if value is None else next(scalars) for value in row] for row in out]


def with_advantages(groups: list[list[TraceSample]], config: AdvantageConfig | None) -> list[list[TraceSample]]:
    """``groups`` with each sample's ``advantage`` set by :func:`sample_advantages` (unchanged when ``config`` is
    None): what ``verl_outputs``, ``slime_groups`` and ``trl_rollout`` do with their ``advantages=``."""
    if config is None:
        return groups
    values = sample_advantages(groups, config)
    return [
        [replace(sample, advantage=value) for sample, value in zip(group, row, strict=True)]
        for group, row in zip(groups, values, strict=True)
    ]
