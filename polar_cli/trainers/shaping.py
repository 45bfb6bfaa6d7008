"""Reward shaping declared on the task (``evaluator.shaping``, :class:`~polar_cli.models.RewardShaping`), as pure
functions.

Where it applies: in the gateway, when the session's result is made, so the reward every consumer reads is the shaped
one: ``SessionResult.reward`` and its traces' rewards, the task's reward statistics, ``groups()`` (its dynamic
sampling sees the rewards the trainer trains on), ``polar generate``'s datasets and ``polar export``. Shaping at
training time instead would leave the recorded reward and the trained one apart, and every trainer bridge would have
to repeat it. The evaluator's own reward is kept beside it in ``SessionResult.shaping``.
"""

from __future__ import annotations

from polar_cli.models import AbnormalEnding, RewardShaping, ShapedReward, Trajectory, TrajectoryStatus


def overlong_penalty(length: int, budget: int, cache: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", arXiv 2503.14476, section 3.4), scaled by
    ``penalty``, for a response of ``length`` tokens with ``L_max = budget`` and ``L_cache = cache``::

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                    = -1                                  if L_max < |y|

    times ``penalty``. With ``cache`` 0 it is a hard penalty: 0 up to the budget, ``-penalty`` past it. Added to the
    reward (never replaces it)."""
    if budget < 1 or not 0 <= cache <= budget:
        raise ValueError(f"overlong penalty needs budget >= 1 and 0 <= cache <= budget, not {budget=}, {cache=}")
    if length <= budget - cache:
        return 0.0
    if length > budget:
        return -penalty
    return penalty * ((budget - cache) - length) / cache


def abnormal_ending(status: TrajectoryStatus) -> AbnormalEnding | None:
    """``status`` when it is an ending shaping may give a fixed reward (timeout, limit, error), else None."""
    match status:
        case "timeout" | "limit" | "error":
            return status
    return None


def shape_reward(
    reward: float | None, status: TrajectoryStatus, sampled_tokens: int, shaping: RewardShaping
) -> ShapedReward:
    """The reward of a session that ended ``status`` after sampling ``sampled_tokens`` tokens, from the evaluator's
    ``reward`` (None: not scored), under ``shaping``:

    - a ``timeout``, ``limit`` or ``error`` ending with a fixed reward declared: that reward, whatever the evaluator
      said (or did not say); no overlong penalty is added to it;
    - else, with ``overlong`` declared and a reward: ``reward + overlong_penalty(sampled_tokens, ...)``;
    - else the reward unchanged (None stays None: shaping never invents a reward for an unscored session).
    """
    ending = abnormal_ending(status)
    fixed = None if ending is None else shaping.ending_reward(ending)
    if fixed is not None:
        return ShapedReward(evaluator_reward=reward, reward=fixed, ending=ending, sampled_tokens=sampled_tokens)
    penalty = 0.0
    if shaping.overlong is not None and reward is not None:
        over = shaping.overlong
        penalty = overlong_penalty(sampled_tokens, over.budget, over.cache, over.penalty)
    shaped = None if reward is None else reward + penalty
    return ShapedReward(evaluator_reward=reward, reward=shaped, overlong_penalty=penalty, sampled_tokens=sampled_tokens)


def shape_trajectory(trajectory: Trajectory, shaped: ShapedReward) -> Trajectory:
    """A copy of ``trajectory`` with ``shaped`` applied to its rewards (before the task's ``reward_to`` assigns
    them): the trajectory's reward is the shaped one; each trace's reward (an evaluator's per-trace reward, else the
    session's) gets the same treatment: the ending's fixed reward, or the overlong penalty added. Pure."""

    def trace_reward(value: float | None) -> float | None:
        if shaped.ending is not None:
            return shaped.reward
        return None if value is None else value + shaped.overlong_penalty

    traces = [trace.model_copy(update={"reward": trace_reward(trace.reward)}) for trace in trajectory.traces]
    return trajectory.model_copy(update={"traces": traces, "reward": shaped.reward})
