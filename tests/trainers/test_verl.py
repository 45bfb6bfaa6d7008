"""veRL outputs. veRL 0.9.1 does not install into this Python without replacing its transformers (5.24 -> 5.10.4),
tokenizers, huggingface_hub and more (``pip install --dry-run verl==0.9.1``), so ``AgentLoopOutput`` is not imported
here: its fields, as read in veRL 0.9.1's ``verl/experimental/agent_loop/agent_loop.py``, are written below, and the
outputs are validated by a pydantic model with those names and types (``extra="forbid"``: veRL's own model ignores
unknown keys, so a misspelled one would vanish silently there)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from polar_cli.errors import AdapterError
from polar_cli.groups import Group
from polar_cli.models import Trace
from polar_cli.trainers import verl_output, verl_outputs, verl_trace_output
from tests.conftest import shared_fixture
from tests.trainers.helpers import make_result, make_trace


class AgentLoopMetrics(BaseModel):
    """veRL 0.9.1 ``AgentLoopMetrics``'s fields."""

    model_config = ConfigDict(extra="forbid")
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


class AgentLoopOutputFields(BaseModel):
    """veRL 0.9.1 ``AgentLoopOutput``'s fields: names, types and which are required (``metrics`` is)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}
    mm_processor_kwargs: dict[str, Any] | None = None
    mm_processor_output: list[dict[str, Any]] | None = None


def check(kwargs: dict[str, Any]) -> AgentLoopOutputFields:
    output = AgentLoopOutputFields.model_validate(kwargs)
    n = len(output.response_ids)
    assert len(output.response_mask) == n
    assert output.response_logprobs is not None and len(output.response_logprobs) == n
    return output


def test_the_stand_in_rejects_what_veRL_would_drop_or_refuse() -> None:
    with pytest.raises(ValidationError):
        AgentLoopOutputFields.model_validate({"prompt_ids": [1], "response_ids": [2], "response_mask": [1]})
    with pytest.raises(ValidationError):  # a misspelled key
        AgentLoopOutputFields.model_validate(
            {"prompt_ids": [1], "response_ids": [2], "response_mask": [1], "metrics": {}, "reward": 1.0}
        )


def test_the_paper_trace_as_an_agent_loop_output() -> None:
    trace = Trace.model_validate(shared_fixture("paper_trace.json"))
    output = check(verl_trace_output(trace).to_kwargs())
    assert output.prompt_ids == trace.prompt_ids
    assert output.response_ids == trace.response_ids
    assert output.response_mask == [1, 1, 1, 0, 0]
    assert output.response_logprobs == [-0.21, -0.44, 0.0, 0.0, 0.0]
    assert output.reward_score == 1.0
    assert output.num_turns == 3
    assert output.extra_fields["polar"]["session_id"] == "session-123"
    assert output.extra_fields["polar"]["status"] == "COMPLETED"
    assert "uid" not in output.extra_fields  # veRL's trainer owns the uid inside an agent loop


def test_one_output_per_session_in_an_agent_loop() -> None:
    main = make_trace([1, 0, 1], reward=0.5)
    sub = make_trace([1], role="subagent", first_id=300)
    output = check(verl_output(make_result([main, sub])).to_kwargs())
    assert output.response_ids == main.response_ids and output.reward_score == 0.5
    compacted = make_result([make_trace([1], first_id=10), make_trace([1, 1], first_id=20)], session_id="s-c")
    with pytest.raises(AdapterError, match="s-c"):
        verl_output(compacted)
    assert check(verl_output(compacted, traces="last_main").to_kwargs()).response_ids == [20, 21]
    with pytest.raises(AdapterError, match="no single veRL output"):
        verl_output(make_result([main], status="cancelled"))


def test_failed_sessions_train_nothing_and_say_so() -> None:
    output = check(verl_output(make_result([make_trace([1, 1])], status="error")).to_kwargs())
    assert output.response_mask == [0, 0]
    assert output.response_logprobs == [0.0, 0.0]
    assert output.extra_fields["polar"]["status"] == "FAILED"


def test_each_trace_of_a_group_shares_the_group_uid() -> None:
    results = [
        make_result([make_trace([1]), make_trace([1], role="subagent", reward=0.0)], session_id="s-0"),
        make_result([make_trace([1], reward=0.0)], session_id="s-1", sample_index=1),
    ]
    group = Group(task_id="task-1", group_id="g-1", num_samples=2, results=results, rewards=[1.0, 0.0])
    each = [check(o.to_kwargs()) for o in verl_outputs(group, traces="each")]
    assert [(o.extra_fields["polar"]["session_id"], o.reward_score) for o in each] == [
        ("s-0", 1.0),
        ("s-0", 0.0),
        ("s-1", 0.0),
    ]
    assert {o.extra_fields["uid"] for o in each} == {"g-1"}
    assert len(verl_outputs(group)) == 2  # main: one per session


def test_context_exact_goes_with_the_sample() -> None:
    from polar_cli.builders import build_trajectory
    from tests.builders.helpers import IM_END, drifting_session

    loose = build_trajectory("prefix_merging", drifting_session(), eos_token_id=IM_END, merge="prompt_prefix")
    (inexact,) = loose.traces
    assert not inexact.context_exact
    outputs = [verl_trace_output(t) for t in (inexact, make_trace([1, 1]))]
    assert [check(o.to_kwargs()).extra_fields["polar"]["context_exact"] for o in outputs] == [False, True]


def test_to_native_without_verl_is_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """veRL is simulated absent (``sys.modules["verl"] = None`` makes its import fail as when it is not installed)."""
    from polar_cli.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "verl", None)
    with pytest.raises(MissingDependencyError, match=r"^VerlAgentLoopOutput.to_native needs verl: pip install verl$"):
        verl_trace_output(make_trace([1])).to_native()


def test_outputs_of_several_groups_as_slime_groups_takes_them() -> None:
    """``verl_outputs([g1, g2])`` (a step's groups, as ``slime_groups`` and ``trl_rollout`` take them) is one flat
    batch, each row with its own group's uid; one group alone still works; a list of something else names it."""
    def group(name: str) -> Group:
        trace = make_trace([1], metadata={"group_id": f"g-{name}", "task_id": f"task-{name}"})
        results = [make_result([trace], session_id=f"{name}-{i}", sample_index=i, task_id=f"task-{name}")
                   for i in range(2)]  # fmt: skip
        return Group(task_id=f"task-{name}", group_id=f"g-{name}", num_samples=2, results=results, rewards=[1.0, 1.0])

    g1, g2 = group("a"), group("b")
    batch = [check(o.to_kwargs()) for o in verl_outputs([g1, g2])]
    assert [(o.extra_fields["uid"], o.extra_fields["polar"]["session_id"]) for o in batch] == [
        ("g-a", "a-0"), ("g-a", "a-1"), ("g-b", "b-0"), ("g-b", "b-1")]  # fmt: skip
    assert len(verl_outputs(g1)) == 2 and len(verl_outputs([g1.results, g2.results])) == 4
    assert len(verl_outputs(list(g1.results))) == 2  # one task's sessions: one group, as before
    with pytest.raises(AdapterError, match=r"verl_outputs: group 1 is a str"):
        verl_outputs([g1, "g2"])  # type: ignore[list-item]
