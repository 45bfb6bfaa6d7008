"""Trainer adapters (docs/trainers.md): Polar's traces and groups in the shapes Slime, veRL and TRL consume.

Plain functions over Polar's models; no trainer is imported when this package is (each output's ``to_native()``
imports its trainer when called); :mod:`polar_cli.trainers.tensorboard` names a step's rollout statistics for any
``SummaryWriter``. The shared rules (which traces are samples, status, mask, flat logprobs) are in
:mod:`polar_cli.trainers.rules`; advantages (GRPO, Dr. GRPO, RLOO, task normalization) in
:mod:`polar_cli.trainers.advantages`; reward shaping, which the gateway applies, in :mod:`polar_cli.trainers.shaping`.
veRL's agent loop over Polar rollouts is :mod:`polar_cli.trainers.verl_loop`, which imports veRL and Ray: import it
where veRL runs (this package never does).
"""

from polar_cli.trainers.advantages import (
    AdvantageConfig,
    Estimator,
    dr_grpo,
    estimate,
    group_advantages,
    grpo,
    rloo,
    sample_advantages,
    task_normalize,
)
from polar_cli.trainers.rules import (
    SampleStatus,
    TraceRule,
    TraceSample,
    flat_logprobs,
    sample_status,
    samples,
    select_traces,
    token_versions,
    trace_sample,
)
from polar_cli.trainers.shaping import overlong_penalty, shape_reward, shape_trajectory
from polar_cli.trainers.slime import SlimeSample, slime_groups, slime_sample, slime_samples
from polar_cli.trainers.tensorboard import step_scalars, write_step
from polar_cli.trainers.trl import (
    TrlRolloutOutput,
    distinct_prompts,
    polar_advantage_func,
    polar_reward_func,
    trl_rollout,
)
from polar_cli.trainers.verl import (
    VerlAgentLoopMetrics,
    VerlAgentLoopOutput,
    verl_output,
    verl_outputs,
    verl_trace_output,
)

__all__ = [
    "AdvantageConfig",
    "Estimator",
    "SampleStatus",
    "SlimeSample",
    "TraceRule",
    "TraceSample",
    "TrlRolloutOutput",
    "VerlAgentLoopMetrics",
    "VerlAgentLoopOutput",
    "distinct_prompts",
    "dr_grpo",
    "estimate",
    "flat_logprobs",
    "group_advantages",
    "grpo",
    "overlong_penalty",
    "polar_advantage_func",
    "polar_reward_func",
    "rloo",
    "sample_advantages",
    "sample_status",
    "samples",
    "select_traces",
    "shape_reward",
    "shape_trajectory",
    "slime_groups",
    "slime_sample",
    "slime_samples",
    "step_scalars",
    "task_normalize",
    "token_versions",
    "trace_sample",
    "trl_rollout",
    "verl_output",
    "verl_outputs",
    "verl_trace_output",
    "write_step",
]
