"""A training step's rollout statistics for TensorBoard (docs/trainers.md, "TensorBoard"): what one
``client.groups()`` call gave the trainer (its usable groups and its ``GroupStats``) as named scalars, and a writer
for any ``SummaryWriter`` (``torch.utils.tensorboard`` or ``tensorboardX``; neither is imported here).

The rewards are :func:`polar_cli.rewards.reward_stats` over every group the call judged (usable and dropped, each
with all its finished sessions), so the share of zero-variance groups counts the ones dynamic sampling dropped too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from polar_cli.groups import Group, GroupStats
from polar_cli.rewards import DEFAULT_MIN_REWARD, reward_stats, trainable_tokens

PREFIX = "polar"


class ScalarWriter(Protocol):
    """What is used of a ``SummaryWriter``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any: ...


def step_scalars(groups: Sequence[Group], stats: GroupStats | None = None,
                 min_reward: float = DEFAULT_MIN_REWARD) -> dict[str, float]:  # fmt: skip
    """The step's scalars by name (docs/trainers.md lists them); a figure with no value this step is left out.
    ``groups``: the usable groups of the step; ``stats``: the same call's GroupStats (dropped groups, cancelled
    tasks); ``min_reward``: the reward at which a session is accepted (pass@k's correct)."""
    judged = [*groups, *(d.group for d in stats.dropped)] if stats is not None else list(groups)
    rewards = reward_stats([g.outcomes(min_reward) for g in judged])
    out: dict[str, float] = {
        "rewards/sessions": rewards.sessions,
        "rewards/accepted": rewards.accepted,
        "groups/usable": len(groups),
        "sessions/usable": sum(len(g.results) for g in groups),
        "sessions/dropped": sum(len(g.dropped) for g in groups),
        "tokens/trainable": sum(trainable_tokens(r) for g in groups for r in g.results),
    }
    for name, value in (("rewards/mean", rewards.mean), ("rewards/std", rewards.std),
                        ("rewards/zero_variance_share", rewards.zero_variance_share)):  # fmt: skip
        if value is not None:
            out[name] = value
    for k, value in rewards.pass_at_k.items():
        out[f"rewards/pass@{k}"] = value
    usable = [r for g in groups for r in g.rewards]
    if usable:
        out["rewards/usable_mean"] = sum(usable) / len(usable)
    staleness = [g.staleness for g in groups if g.staleness is not None]
    if staleness:
        out["staleness/mean"] = sum(staleness) / len(staleness)
        out["staleness/max"] = max(staleness)
    versions = [g.policy_version for g in groups if g.policy_version is not None]
    if versions:
        out["policy_version"] = max(versions)
    if stats is not None:
        out["groups/submitted"] = len(stats.submitted)
        out["groups/dropped"] = len(stats.dropped)
        for reason, count in sorted(stats.dropped_by_reason().items()):
            out[f"groups/dropped/{reason}"] = count
        out["groups/cancelled"] = len(stats.cancelled)
        out["groups/unused"] = len(stats.unused)
        out["groups/reused"] = len(stats.reused)
        out["groups/carried_out"] = len(stats.carried_out)
    return {f"{PREFIX}/{name}": float(value) for name, value in out.items()}


def write_step(writer: ScalarWriter, step: int, groups: Sequence[Group], stats: GroupStats | None = None, *,
               extra: Mapping[str, float] | None = None,
               min_reward: float = DEFAULT_MIN_REWARD) -> dict[str, float]:  # fmt: skip
    """Write :func:`step_scalars` (and ``extra``, the trainer's own figures, under their own names) at ``step``;
    returns what was written. The caller flushes and closes its writer."""
    scalars = {**step_scalars(groups, stats, min_reward), **(extra or {})}
    for name, value in scalars.items():
        writer.add_scalar(name, value, global_step=step)
    return scalars
