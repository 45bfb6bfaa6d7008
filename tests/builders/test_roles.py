"""Chain roles (issue 21): the builders give every trace a role and its reason from the chains and the harness adapter,
and ``assign_rewards`` gives the session's reward to the roles ``reward_to`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar_cli.builders import BuildContext, build_trajectory
from polar_cli.builders.roles import REWARDED, assign_rewards
from polar_cli.groups import session_cause
from polar_cli.interfaces.harness import Harness, HarnessContext, HarnessLaunch, RoleVerdict, system_prompt
from polar_cli.models import ChainRole, Completion, SessionResult, TaskRequest, Trace, Trajectory
from polar_cli.registry import get_harness
from tests.builders.helpers import GEN, IM_END, IM_START, NL, completion, exact_session, three_turn_session, user_turn

MEMORY_PROMPT = "You are now acting as the managed memory extraction subagent for an AI coding assistant."


def new_context(index: int, system: str, first: int = 500) -> Completion:
    """A one-call chain with its own system prompt and tokens (nothing in common with the main chain)."""
    prompt = [IM_START, first, NL, first + 1, IM_END, NL, *user_turn(first + 2), *GEN]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
    return completion(index, prompt, [first + 3, IM_END], messages=messages)


def renumbered(completions: list[Completion]) -> list[Completion]:
    return [c.model_copy(update={"index": i, "completion_id": f"c{i}"}) for i, c in enumerate(completions)]


def roles(trajectory: Trajectory) -> list[tuple[str | None, str | None]]:
    return [(t.role, t.role_reason) for t in trajectory.traces]


@pytest.mark.parametrize("strategy", ["prefix_merging", "per_request"])
def test_the_first_chain_is_main_and_qwen_codes_memory_agent_is_side(strategy: str) -> None:
    session = [*exact_session(), new_context(3, MEMORY_PROMPT)]
    traj = build_trajectory(strategy, session, context=BuildContext(harness="qwen_code"), eos_token_id=IM_END)
    got = [t.role for t in traj.traces]
    assert got == (["main", "side"] if strategy == "prefix_merging" else ["main", "main", "main", "side"])
    assert traj.traces[0].role_reason == "the session's first chain"
    assert traj.traces[-1].role_reason == ("qwen_code: the background memory extraction agent (its system prompt)")
    assert all(t.trainable and t.reward is None for t in traj.traces)  # the builder decides roles, not rewards
    if strategy == "prefix_merging":
        assert traj.metadata["chain_roles"] == ["main", "side"]


def test_an_unrecognised_new_context_is_a_subagent_and_a_retry_keeps_its_chains_role() -> None:
    main = exact_session()
    retry = main[0].model_copy()  # the same prompt again: a retried call of the main conversation
    session = renumbered([main[0], new_context(1, "You are a sub-agent: search the code."), retry, *main[1:]])
    traj = build_trajectory("prefix_merging", session, context=BuildContext(harness="qwen_code"), eos_token_id=IM_END)
    assert [t.role for t in traj.traces] == ["main", "subagent", "main"]
    assert traj.traces[1].role_reason is not None and "a sub-agent" in traj.traces[1].role_reason
    assert traj.traces[2].role_reason == "continues chain 0 (main) after a same_prompt break"


def test_a_side_call_before_the_main_conversation_leaves_main_to_the_next_chain() -> None:
    title = new_context(0, "Generate a concise, sentence-case title (3-7 words) for this session.")
    session = renumbered([title, *exact_session()])
    traj = build_trajectory("prefix_merging", session, context=BuildContext(harness="qwen_code"), eos_token_id=IM_END)
    assert roles(traj) == [
        ("side", "qwen_code: a session title call (its system prompt)"),
        ("main", "the first chain the harness adapter did not call its own"),
    ]


def test_without_a_known_harness_the_builder_decides_alone() -> None:
    session = [*exact_session(), new_context(3, MEMORY_PROMPT)]
    for context in (BuildContext(), BuildContext(harness="not-installed")):
        traj = build_trajectory("prefix_merging", session, context=context, eos_token_id=IM_END)
        assert [t.role for t in traj.traces] == ["main", "subagent"]


def test_per_request_without_end_of_turn_ids_still_finds_each_calls_chain() -> None:
    """No eos id and completions that disagree on their last token: the exact rule needs none to see that each prompt
    holds the ids sampled before it (one chain); under the paper's rule every call is its own chain, each continuing
    the one before it (``no_end_of_turn``). Either way the roles are those of the merged chains."""
    session = [*exact_session(), new_context(3, MEMORY_PROMPT)]
    session[2] = session[2].model_copy(update={"response_ids": [320, 321], "response_logprobs": [-2.0, -0.1]})
    traj = build_trajectory("per_request", session, context=BuildContext(harness="qwen_code"))
    assert [t.role for t in traj.traces] == ["main", "main", "main", "side"]
    assert traj.traces[1].role_reason == "the session's first chain"
    loose = build_trajectory("per_request", session, context=BuildContext(harness="qwen_code"), merge="prompt_prefix")
    assert [t.role for t in loose.traces] == ["main", "main", "main", "side"]
    assert loose.traces[1].role_reason == "continues chain 0 (main) after a no_end_of_turn break"


class _Marked(Harness):
    """An adapter that knows its side calls by something other than the system prompt."""

    name = "marked"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        raise NotImplementedError

    def chain_role(self, first: Completion) -> RoleVerdict | None:
        return RoleVerdict("side", "tagged by the harness") if first.request.get("side") else None


def test_an_adapter_can_classify_by_any_evidence_of_the_first_call() -> None:
    from polar_cli.builders.chains import partition
    from polar_cli.builders.roles import chain_roles

    side = new_context(3, "anything").model_copy(update={"request": {"side": True}})
    session = [*exact_session(), side]
    parts = partition(session, frozenset({IM_END}))
    assert chain_roles(parts, session, _Marked()) == [
        RoleVerdict("main", "the session's first chain"),
        RoleVerdict("side", "tagged by the harness"),
    ]
    assert _Marked().chain_role(new_context(0, MEMORY_PROMPT)) is None  # no side_prompts of its own


def test_side_prompts_of_the_adapters_match_their_real_calls() -> None:
    parts = [{"type": "text", "text": "You are a Claude agent."},
             {"type": "text", "text": "You are evaluating a stop-condition hook in Claude Code. Read ..."}]  # fmt: skip
    hook = new_context(0, "").model_copy(update={"request_messages": [{"role": "system", "content": parts}]})
    assert system_prompt(hook).endswith("stop-condition hook in Claude Code. Read ...")
    assert get_harness("qwen_code").chain_role(new_context(0, MEMORY_PROMPT)) == RoleVerdict(
        "side", "qwen_code: the background memory extraction agent (its system prompt)"
    )
    assert get_harness("qwen_code").chain_role(three_turn_session()[0]) is None
    title = new_context(0, "You are a title generator. You output ONLY a thread title. Nothing else.")
    assert get_harness("opencode").chain_role(title) == RoleVerdict(
        "side", "opencode: the title agent (its system prompt)"
    )
    assert get_harness("pi").chain_role(title) is None  # an adapter without side_prompts calls nothing side


def traced(*roles: ChainRole | None, reward: float | None = None) -> Trajectory:
    traces = [Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1], role=role, reward=reward) for role in roles]
    return Trajectory(status="completed", traces=traces)


@pytest.mark.parametrize(
    ("reward_to", "expected"),
    [
        ("main", [1.0, None, None, 1.0]),
        ("main+subagents", [1.0, 1.0, None, 1.0]),
        ("all", [1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_assign_rewards_gives_the_reward_to_the_roles_the_rule_names(reward_to: Any, expected: list[Any]) -> None:
    trajectory = traced("main", "subagent", "side", None)  # None: a trace built before roles, rewarded as then
    got = assign_rewards(trajectory, 1.0, reward_to)
    assert [t.reward for t in got.traces] == expected
    assert [t.trainable for t in got.traces] == [r is not None for r in expected]
    assert [t.reward for t in trajectory.traces] == [None] * 4  # pure: the input is unchanged
    assert set(REWARDED) == {"main", "main+subagents", "all"}


def test_assign_rewards_keeps_a_per_trace_reward_and_clears_an_excluded_one() -> None:
    got = assign_rewards(traced("main", "side", reward=0.25), 1.0, "main+subagents")
    assert [(t.reward, t.trainable) for t in got.traces] == [(0.25, True), (None, False)]
    unscored = assign_rewards(traced("main", "side"), None, "all")  # the evaluation failed: no reward for anyone
    assert [(t.reward, t.trainable) for t in unscored.traces] == [(None, True), (None, True)]


def test_a_session_whose_only_trainable_token_is_in_a_side_trace_is_not_usable() -> None:
    trajectory = assign_rewards(traced("side", "main", reward=1.0), 1.0, "main+subagents")
    trajectory.traces[1].loss_mask[0] = 0  # the main trace trains nothing
    result = SessionResult(session_id="s", task_id="t", status="completed", reward=1.0, num_completions=2,
                           trajectory=trajectory)  # fmt: skip
    assert session_cause(result) == ("no_trainable_token", "none of its 2 traces is trainable with a trainable token")
    trajectory.traces[1].loss_mask[0] = 1
    assert session_cause(result) is None


def test_reward_to_defaults_to_main_and_subagents_and_rejects_other_rules() -> None:
    task = TaskRequest(instruction="x", agent={"harness": "pi"})
    assert task.evaluator.reward_to == "main+subagents"
    with pytest.raises(ValueError, match="reward_to"):
        TaskRequest(instruction="x", agent={"harness": "pi"}, evaluator={"reward_to": "side"})


def test_export_writes_role_and_trainable_per_trace(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from polar_cli.export import ExportOptions, export
    from polar_cli.generate.ledger import Ledger, ResultRow

    trajectory = assign_rewards(traced("main", "side", None, reward=1.0), 1.0, "main+subagents")
    with Ledger(tmp_path / "gen") as ledger:
        ledger.remember_task(0, "r", TaskRequest(task_id="t0", instruction="x", agent={"harness": "pi"}))
        result = SessionResult(session_id="s0", task_id="t0", status="completed", reward=1.0, num_completions=2,
                               trajectory=trajectory)  # fmt: skip
        assert ledger.finish(ResultRow("t0", 0, "s0", "r", 1, "completed", 1.0, True, 2, 3, 3, 2), result)
    export(tmp_path / "gen", tmp_path / "ds", ExportOptions())
    rows = pq.read_table(tmp_path / "ds" / "traces" / "train-00000.parquet").to_pylist()
    assert [(r["role"], r["trainable"]) for r in rows] == [("main", True), ("side", False), (None, True)]
