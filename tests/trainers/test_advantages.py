"""Advantages (polar_cli/trainers/advantages.py): exact values on hand-computed batches, the documented handling of
equal-reward groups and groups of one, AgentRL's task normalization (each family mean 0, std 1 over its mask-1
tokens), invariants under hypothesis, and the adapters' ``advantages=``."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from polar_cli.errors import ConfigError
from polar_cli.groups import Group
from polar_cli.trainers import (
    AdvantageConfig,
    dr_grpo,
    group_advantages,
    grpo,
    rloo,
    slime_groups,
    task_normalize,
    trl_rollout,
    verl_outputs,
)
from tests.support.docs import ROOT, code_blocks
from tests.trainers.helpers import make_result, make_trace

ESTIMATORS = (grpo, dr_grpo, rloo)

# ---- one group ------------------------------------------------------------------------------------------------------


def test_grpo_on_a_hand_computed_group() -> None:
    # mean 0.5; sample std sqrt((4 * 0.25) / 3) = 1 / sqrt(3); (+-0.5) * sqrt(3) = +-sqrt(3) / 2
    half = math.sqrt(3) / 2
    assert grpo([1.0, 0.0, 0.0, 1.0], eps=0.0).tolist() == pytest.approx([half, -half, -half, half], abs=1e-15)
    # with eps: (r - mean) / (std + eps)
    spread = math.sqrt(0.5) + 0.5  # the sample std of (1, 0) plus eps
    assert grpo([1.0, 0.0], eps=0.5).tolist() == pytest.approx([0.5 / spread, -0.5 / spread])
    # rewards 1, 2, 3, 6: mean 3, sample variance (4 + 1 + 0 + 9) / 3 = 14 / 3
    std = math.sqrt(14 / 3)
    assert grpo([1, 2, 3, 6], eps=0.0).tolist() == pytest.approx([-2 / std, -1 / std, 0.0, 3 / std])


def test_dr_grpo_and_rloo_on_a_hand_computed_group() -> None:
    assert dr_grpo([1, 2, 3, 6]).tolist() == [-2.0, -1.0, 0.0, 3.0]
    # leave-one-out baselines: (2+3+6)/3, (1+3+6)/3, (1+2+6)/3, (1+2+3)/3
    assert rloo([1, 2, 3, 6]).tolist() == pytest.approx([1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0])
    assert rloo([1.0, 0.0]).tolist() == [1.0, -1.0]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_equal_rewards_and_a_group_of_one_give_exact_zeros(estimator: Callable[..., np.ndarray]) -> None:
    # 0.1 * 3 / 3 is not 0.1 in floating point: without the rule, GRPO would divide rounding noise by eps
    assert estimator([0.1, 0.1, 0.1]).tolist() == [0.0, 0.0, 0.0]
    assert estimator([-0.2] * 8).tolist() == [0.0] * 8
    assert estimator([0.7]).tolist() == [0.0]
    assert estimator([]).tolist() == []


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_rewards_must_be_finite_numbers_in_one_row(estimator: Callable[..., np.ndarray]) -> None:
    with pytest.raises(ValueError, match="finite"):
        estimator([1.0, float("nan")])
    with pytest.raises(ValueError, match="one number per sample"):
        estimator([[1.0, 0.0]])


def test_group_advantages_follow_the_groups_usable_sessions() -> None:
    results = [make_result([make_trace([1])], session_id=f"s-{i}", sample_index=i, reward=r)
               for i, r in enumerate([1.0, 0.0, 0.5])]  # fmt: skip
    group = Group(task_id="task-1", num_samples=3, results=results, rewards=[1.0, 0.0, 0.5])
    assert group_advantages(group, "dr_grpo").tolist() == [0.5, -0.5, 0.0]
    assert group_advantages(group).tolist() == pytest.approx([1.0, -1.0, 0.0], abs=1e-5)  # sample std 0.5


rewards = st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=16)


@given(rewards)
def test_every_estimator_is_zero_mean_per_group(values: list[float]) -> None:
    for estimator in ESTIMATORS:
        out = estimator(values)
        assert abs(float(out.sum())) <= 1e-9 * len(values) * max(1.0, float(np.abs(out).max()))


@given(rewards)
def test_rloo_is_dr_grpo_scaled_by_n_over_n_minus_one(values: list[float]) -> None:
    n = len(values)
    expected = dr_grpo(values) * (n / (n - 1) if n > 1 else 0.0)
    assert np.allclose(rloo(values), expected, atol=1e-9)


@given(rewards, st.floats(-5, 5), st.floats(0.1, 10))
def test_grpo_is_invariant_to_shifting_and_scaling_the_rewards(values: list[float], shift: float, scale: float) -> None:
    moved = [scale * v + shift for v in values]
    if len(set(moved)) != len(set(values)):  # rounding merged or split equal rewards: another group
        return
    if np.ptp(values) < 1e-3:  # near-equal rewards: eps is no longer negligible against the spread
        return
    assert np.allclose(grpo(moved, eps=0.0), grpo(values, eps=0.0), atol=1e-6)


@given(st.floats(-10, 10, allow_nan=False), st.integers(1, 16))
def test_equal_rewards_give_zeros_for_any_value_and_size(value: float, n: int) -> None:
    for estimator in ESTIMATORS:
        assert estimator([value] * n).tolist() == [0.0] * n


# ---- task normalization ---------------------------------------------------------------------------------------------


def test_task_normalization_on_a_hand_computed_batch() -> None:
    out = task_normalize(
        advantages=[[1.0, 1.0, 5.0], -1.0, 3.0, 0.5, 0.5],
        masks=[[1, 1, 0], [1, 0, 1, 1], [1, 1], [1], [0, 1]],
        families=["web", "web", "os", "db", "db"],
    )
    # web: mask-1 tokens 1, 1, -1, -1, -1: mean -0.2, std sqrt((2 * 1.44 + 3 * 0.64) / 5) = sqrt(0.96)
    std = math.sqrt(0.96)
    assert out[0].tolist() == pytest.approx([1.2 / std, 1.2 / std, 0.0])  # the mask-0 token: 0
    assert out[1].tolist() == pytest.approx([-0.8 / std, 0.0, -0.8 / std, -0.8 / std])
    # os: all its mask-1 advantages equal (3, 3); db: 0.5 and 0.5: no spread, zeros
    assert out[2].tolist() == [0.0, 0.0]
    assert out[3].tolist() == [0.0] and out[4].tolist() == [0.0, 0.0]


def test_task_normalization_checks_its_shapes() -> None:
    with pytest.raises(ValueError, match="one of each per sample"):
        task_normalize([1.0], [[1], [1]], ["a", "a"])
    with pytest.raises(ValueError, match="sample 0: 2 advantages for 3 mask entries"):
        task_normalize([[1.0, 2.0]], [[1, 1, 1]], ["a"])


batches = st.lists(
    st.tuples(
        st.lists(st.tuples(st.floats(-10, 10, allow_nan=False), st.integers(0, 1)), min_size=1, max_size=12),
        st.sampled_from(["alfworld", "webshop", "os"]),
    ),
    min_size=1,
    max_size=12,
)


@given(batches)
def test_each_family_has_mean_zero_and_std_one_over_its_mask_1_tokens(batch: list[Any]) -> None:
    advantages = [[a for a, _ in tokens] for tokens, _ in batch]
    masks = [[m for _, m in tokens] for tokens, _ in batch]
    families = [family for _, family in batch]
    out = task_normalize(advantages, masks, families)
    for family in set(families):
        members = [i for i, f in enumerate(families) if f == family]
        before = np.concatenate([np.asarray(advantages[i])[np.asarray(masks[i], dtype=bool)] for i in members])
        after = np.concatenate([out[i][np.asarray(masks[i], dtype=bool)] for i in members])
        if before.size == 0 or np.all(before == before[0]) or not before.std() > 0:
            assert np.all(after == 0.0)  # no spread, no mask-1 token, or a spread below float precision: as documented
        else:
            assert abs(after.mean()) < 1e-9 and abs(after.std() - 1.0) < 1e-9
    for i, mask in enumerate(masks):
        assert all(out[i][t] == 0.0 for t, m in enumerate(mask) if not m)


# ---- the adapters' advantages= ---------------------------------------------------------------------------------------


def task_group(task: str, family: str, rewards: list[float], masks: list[list[int]] | None = None) -> Group:
    masks = masks or [[1, 1]] * len(rewards)
    results = [
        make_result([make_trace(mask, reward=r, metadata={"task_id": task, "group_id": task, "env": family})],
                    session_id=f"{task}-{i}", sample_index=i, task_id=task, reward=r)
        for i, (r, mask) in enumerate(zip(rewards, masks, strict=True))
    ]  # fmt: skip
    return Group(task_id=task, group_id=task, num_samples=len(rewards), results=results, rewards=rewards,
                 metadata={"env": family})  # fmt: skip


def test_the_adapters_carry_each_samples_advantage_beside_the_recorded_reward() -> None:
    groups = [task_group("t1", "web", [1.0, 0.0, 0.0, 1.0]), task_group("t2", "os", [0.5, 0.5])]
    config = AdvantageConfig(estimator="dr_grpo")
    expected = [0.5, -0.5, -0.5, 0.5, 0.0, 0.0]
    verl = verl_outputs(groups, advantages=config)
    assert [o.extra_fields["polar"]["advantage"] for o in verl] == expected
    assert [o.reward_score for o in verl] == [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]  # the reward stays the recorded one
    slime = [s for group in slime_groups(groups, advantages=config) for s in group]
    assert [s.metadata["polar"]["advantage"] for s in slime] == expected
    trl = trl_rollout(groups[:1], num_generations=4, advantages=config)
    assert trl.polar_advantage == expected[:4] and trl.polar_reward == [1.0, 0.0, 0.0, 1.0]
    # not asked: no advantage
    assert [o.extra_fields["polar"]["advantage"] for o in verl_outputs(groups)] == [None] * 6
    assert trl_rollout(groups[:1], num_generations=4).polar_advantage == [None] * 4


def test_a_session_of_several_samples_counts_once_in_its_group() -> None:
    two = make_result([make_trace([1], reward=1.0), make_trace([1], reward=1.0, role="subagent")], session_id="a",
                      reward=1.0)  # fmt: skip
    one = make_result([make_trace([1], reward=0.0)], session_id="b", sample_index=1, reward=0.0)
    outputs = verl_outputs([[two, one]], traces="each", advantages=AdvantageConfig(estimator="dr_grpo"))
    # sessions 1.0 and 0.0: mean 0.5 (not 2/3, as counting session a's two traces would give)
    assert [o.extra_fields["polar"]["advantage"] for o in outputs] == [0.5, 0.5, -0.5]


def test_task_normalization_through_the_adapters_by_a_metadata_field() -> None:
    groups = [task_group("t1", "web", [1.0, 0.0], masks=[[1, 1, 1], [1, 0, 0]]), task_group("t2", "web", [3.0, 1.0]),
              task_group("t3", "os", [1.0, 1.0])]  # fmt: skip
    out = verl_outputs(groups, advantages=AdvantageConfig(estimator="dr_grpo", normalize_by="env"))
    values = [o.extra_fields["polar"]["advantage"] for o in out]
    # web tokens: 0.5 x3, -0.5 x1, 1.0 x2, -1.0 x2: mean 0.5/8, normalized per token then read back per sample
    tokens = np.array([0.5] * 3 + [-0.5] + [1.0] * 2 + [-1.0] * 2)
    mean, std = tokens.mean(), tokens.std()
    assert values[:4] == pytest.approx([(a - mean) / std for a in (0.5, -0.5, 1.0, -1.0)])
    assert values[4:] == [0.0, 0.0]  # os: one group, equal rewards
    web = np.repeat(values[:4], [3, 1, 2, 2])
    assert abs(web.mean()) < 1e-12 and web.std() == pytest.approx(1.0)


def test_a_sample_without_the_family_field_is_a_config_error_naming_it() -> None:
    group = task_group("t1", "web", [1.0, 0.0])
    with pytest.raises(ConfigError, match=r"normalize_by='suite': session t1-0 \(task t1\) has no metadata field"):
        verl_outputs([group], advantages=AdvantageConfig(normalize_by="suite"))


def test_the_advantage_config_is_strict() -> None:
    with pytest.raises(ValidationError, match="estimator"):
        AdvantageConfig.model_validate({"estimator": "ppo"})
    with pytest.raises(ValidationError, match="extra"):
        AdvantageConfig.model_validate({"normalise_by": "env"})


def test_the_advantages_snippet_of_the_docs_runs() -> None:
    marker = "tests/trainers/test_advantages.py::test_the_advantages_snippet_of_the_docs_runs"
    [snippet] = [b for b in code_blocks(ROOT / "docs" / "trainers.md") if b.tested_by == marker]
    scope: dict[str, Any] = {}
    exec(snippet.text, scope)
    # each call the snippet makes gives what its comment says (to the 3 decimals shown)
    lines = snippet.text.splitlines()
    for node in ast.parse(snippet.text).body:
        if not isinstance(node, ast.Expr):
            continue
        value = eval(compile(ast.Expression(node.value), "snippet", "eval"), scope)
        comment = lines[node.end_lineno - 1].partition("#")[2] or lines[node.end_lineno].partition("#")[2]
        groups = re.findall(r"\[([^\]]*)\]", comment)  # the bracketed values: every sample's for task_normalize
        groups = groups if isinstance(value, list) else groups[:1]
        shown = [float(x) for group in groups for x in group.split(",")]
        got = [float(x) for x in (np.concatenate(value) if isinstance(value, list) else value)]
        assert got == pytest.approx(shown, abs=1e-3), (ast.unparse(node), comment)
