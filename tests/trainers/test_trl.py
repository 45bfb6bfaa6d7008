"""TRL: the adapter's output drives a real ``GRPOTrainer(rollout_func=...)`` (TRL 1.16, CPU) on Polar's tiny random
demo model: one training step, and the trainer's own method that consumes ``rollout_func``'s output
(``_generate_and_score_completions``), whose tensors must hold Polar's ids, mask, logprobs and rewards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import AdapterError
from polar_cli.models import SessionResult
from polar_cli.trainers import AdvantageConfig, distinct_prompts, polar_advantage_func, polar_reward_func, trl_rollout
from tests.trainers.helpers import make_result, make_trace

G = 2  # num_generations


def group_for(prompt: str, position: int) -> list[SessionResult]:
    """G sessions for one prompt: each a main trace (tokens 100+, a tool span masked), a sub-agent trace and an
    untrainable side trace; rewards differ so GRPO has an advantage to compute."""
    results = []
    for i in range(G):
        first = 100 + 10 * (G * position + i)
        main = make_trace([1, 1, 0, 0, 1][: 3 + i], first_id=first, prompt=[5, 6, 7 + position], reward=float(i))
        sub = make_trace([1], role="subagent", first_id=900, reward=float(i))
        side = make_trace([1], role="side", trainable=False, reward=None, first_id=950)
        results.append(make_result([main, sub, side], session_id=f"{prompt}-{i}", sample_index=i, task_id=prompt,
                                   reward=float(i)))  # fmt: skip
    return results


def test_the_rollout_keys_and_order() -> None:
    out = trl_rollout([group_for("a", 0), group_for("b", 1)], num_generations=G)
    kwargs = out.to_kwargs()
    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask"} <= set(kwargs)
    assert len(out) == 2 * G
    assert kwargs["polar_session_id"] == ["a-0", "a-1", "b-0", "b-1"]  # each prompt's completions in a row
    assert kwargs["polar_reward"] == [0.0, 1.0, 0.0, 1.0]
    assert kwargs["env_mask"][1] == [1, 1, 0, 0]
    assert kwargs["logprobs"][1] == pytest.approx([-0.1, -0.2, 0.0, 0.0])
    columns = (kwargs["completion_ids"], kwargs["logprobs"], kwargs["env_mask"])
    assert all(len(ids) == len(lps) == len(mask) for ids, lps, mask in zip(*columns, strict=True))


def test_a_group_must_give_num_generations_samples() -> None:
    short = group_for("a", 0)
    short[1] = short[1].model_copy(update={"status": "stale"})
    with pytest.raises(AdapterError, match=r"1 samples under traces='main'.*num_generations=2"):
        trl_rollout([short], num_generations=G)
    with pytest.raises(AdapterError, match="4 samples under traces='each'"):
        trl_rollout([group_for("a", 0)], num_generations=G, traces="each")


def test_a_failed_session_is_a_sample_that_trains_nothing() -> None:
    group = group_for("a", 0)
    group[0] = group[0].model_copy(update={"status": "error"})
    out = trl_rollout([group], num_generations=G)
    assert out.env_mask[0] == [0, 0, 0] and out.logprobs[0] == [0.0, 0.0, 0.0]
    assert out.polar_status == ["FAILED", "COMPLETED"]


def test_context_exact_is_a_column() -> None:
    group = group_for("a", 0)
    main = group[1].trajectory.traces[0].model_copy(update={"context_exact": False})  # built with prompt_prefix
    traces = [main, *group[1].trajectory.traces[1:]]
    group[1] = group[1].model_copy(update={"trajectory": group[1].trajectory.model_copy(update={"traces": traces})})
    assert trl_rollout([group], num_generations=G).polar_context_exact == [True, False]


def test_distinct_prompts() -> None:
    assert distinct_prompts(["a", "a", "b", "b"], 2) == ["a", "b"]
    with pytest.raises(AdapterError):
        distinct_prompts(["a", "b", "b", "b"], 2)
    with pytest.raises(AdapterError):
        distinct_prompts(["a", "a", "b"], 2)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from polar_cli.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("trl-demo-model"))


@pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")
def test_a_real_grpo_trainer_trains_on_the_rollout(demo_model: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch  # the train extra (CI installs it)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    received: list[list[str]] = []
    sent: list[dict[str, Any]] = []

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        received.append(list(prompts))
        groups = [group_for(p, i) for i, p in enumerate(distinct_prompts(prompts, trainer.num_generations))]
        sent.append(trl_rollout(groups, num_generations=trainer.num_generations).to_kwargs())
        return sent[-1]

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2 * G, num_generations=G, max_steps=1, use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=1, max_completion_length=8, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(demo_model),
        processing_class=AutoTokenizer.from_pretrained(demo_model),
        reward_funcs=[polar_reward_func],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]),
        rollout_func=rollout_func,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    assert sorted(received[0]) == ["a", "a", "b", "b"] and received[0][0] == received[0][1]
    logged = trainer.state.log_history[0]
    model_tokens = [sum(mask) for mask in sent[0]["env_mask"]]
    assert logged["completions/mean_length"] == pytest.approx(sum(model_tokens) / len(model_tokens))
    assert logged["reward"] == pytest.approx(0.5)

    # The trainer's own consumer of rollout_func's output, on one batch: Polar's tokens, mask, logprobs and rewards.
    trainer.model.train()
    scored = trainer._generate_and_score_completions(
        [{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "b"}]
    )
    rollout = sent[-1]
    for row, ids in enumerate(rollout["completion_ids"]):
        n = len(ids)
        assert scored["completion_ids"][row, :n].tolist() == ids
        assert scored["completion_mask"][row, :n].tolist() == [1] * n
        assert scored["tool_mask"][row, :n].tolist() == rollout["env_mask"][row]
        assert scored["sampling_per_token_logps"][row, :n].tolist() == pytest.approx(rollout["logprobs"][row])
        prompt = rollout["prompt_ids"][row]
        assert scored["prompt_ids"][row, -len(prompt) :].tolist() == prompt
    advantages = scored["advantages"]
    assert advantages[0] < 0 < advantages[1] and advantages[2] < 0 < advantages[3]  # rewards 0, 1 in each group
    assert torch.isfinite(advantages).all()


@pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")
def test_polar_advantages_reach_a_real_grpo_trainer_unchanged(
    demo_model: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """``polar_advantage_func`` with ``scale_rewards="none"``: TRL's advantages are Polar's (RLOO here: -1, 1 for
    rewards 0, 1, where TRL's own estimate from the rewards would be -0.5, 0.5 or -0.71, 0.71)."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    sent: list[dict[str, Any]] = []

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        groups = [group_for(p, i) for i, p in enumerate(distinct_prompts(prompts, trainer.num_generations))]
        rollout = trl_rollout(groups, num_generations=G, advantages=AdvantageConfig(estimator="rloo"))
        sent.append(rollout.to_kwargs())
        return sent[-1]

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2 * G, num_generations=G, max_steps=1, use_cpu=True,
        report_to=[], save_strategy="no", max_completion_length=8, disable_tqdm=True, seed=0, scale_rewards="none",
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(demo_model),
        processing_class=AutoTokenizer.from_pretrained(demo_model),
        reward_funcs=[polar_advantage_func],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]),
        rollout_func=rollout_func,
    )
    scored = trainer._generate_and_score_completions([{"prompt": p} for p in ("a", "a", "b", "b")])
    assert sent[-1]["polar_advantage"] == [-1.0, 1.0, -1.0, 1.0]
    assert scored["advantages"].tolist() == sent[-1]["polar_advantage"]
