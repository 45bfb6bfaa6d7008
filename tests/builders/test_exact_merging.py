"""``merge: exact`` (the default): a completion continues a chain only when its prompt holds the chain's last prompt
followed by the ids that completion sampled, so every trace is the context its tokens were sampled in; each break
says where the prompt departed. ``merge: prompt_prefix`` (the paper's rule) says which completions it put in
another context (``context_exact``)."""

from __future__ import annotations

from typing import Any

import pytest

from polar_cli.builders import BuildContext, BuilderConfig, build_trajectory, verify
from polar_cli.builders.chains import BREAK_CAUSES, RUN_WINDOW
from polar_cli.errors import ConfigError
from polar_cli.models import Completion, PromptSpan, TaskRequest, Trace, Trajectory
from polar_cli.registry import get_builder
from tests.builders.helpers import (
    GEN,
    IM_END,
    NL,
    NLNL,
    SYSTEM,
    TASK_MESSAGES,
    call,
    completion,
    decode_spans,
    drifting_session,
    exact_session,
    three_turn_session,
    user_turn,
)
from tests.conftest import shared_fixture


def chains(trajectory: Trajectory) -> list[list[str]]:
    return [t.metadata["completion_ids"] for t in trajectory.traces]


def test_a_prompt_holding_the_sampled_ids_joins_and_the_trace_is_the_last_context() -> None:
    comps = exact_session()
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert chains(traj) == [["c0", "c1", "c2"]] and traj.metadata["breaks"] == []
    (trace,) = traj.traces
    last = comps[-1]
    assert trace.prompt_ids + trace.response_ids == last.prompt_ids + last.response_ids
    assert decode_spans(trace) == [(1, [300, 301, 302, IM_END]), (0, [NL, *user_turn(400), *GEN]),
                                   (1, [310, 311, IM_END]), (0, [NL, *user_turn(401, 402), *GEN]),
                                   (1, [320, IM_END])]  # fmt: skip
    assert trace.context_exact and trace.metadata["context_exact"] == [True, True, True]
    assert traj.metadata["merge"] == "exact" and traj.metadata["context_inexact_completions"] == 0
    assert verify(traj, comps, raise_on_violation=True).ok


def test_a_re_serialized_tool_call_breaks_the_chain_with_where_and_what() -> None:
    comps = three_turn_session()  # the template re-renders the sampled 301 as 399; the second reply is cut
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert chains(traj) == [["c0"], ["c1"], ["c2"]]
    p1, p2, p3 = (c.prompt_ids for c in comps)
    rerendered, truncated = traj.metadata["breaks"]
    assert rerendered == {
        "completion_index": 1, "completion_id": "c1", "chain": 1, "cause": "history_rerendered", "closest_chain": 0,
        "common_prefix": len(p1), "closest_prompt_tokens": len(p1),
        "first_difference": len(p1) + 1,  # p1, then the sampled 300 holds; 301 does not
        "expected_ids": [301, 302, IM_END], "found_ids": p2[len(p1) + 1 :][:RUN_WINDOW],
    }  # fmt: skip
    assert rerendered["found_ids"][:3] == [399, 302, IM_END]
    # the cut reply was sent back as text and closed by the template: its ids all hold, then the prompt goes on
    assert truncated["cause"] == "truncated_reply" and truncated["closest_chain"] == 1
    assert truncated["first_difference"] == len(p2) + 2 and truncated["expected_ids"] == []
    assert truncated["found_ids"] == p3[len(p2) + 2 :][:RUN_WINDOW] and truncated["found_ids"][0] == IM_END
    assert traj.metadata["prefix_break_causes"] == {"truncated_reply": 1, "history_rerendered": 1}
    assert all(t.context_exact for t in traj.traces) and traj.metadata["context_inexact_completions"] == 0
    assert verify(traj, comps, raise_on_violation=True).ok


def test_the_break_windows_are_bounded() -> None:
    p1 = [*SYSTEM, *user_turn(200), *GEN]
    sampled = [*range(1000, 1100), IM_END]
    p2 = [*p1, *range(2000, 2100), IM_END, NL, *user_turn(5), *GEN]
    echoed = [*TASK_MESSAGES[:1], {"role": "user", "content": "turn 0"}, {"role": "assistant", "content": "answer 0"}]
    later = [*echoed, {"role": "user", "content": "5"}]
    comps = [completion(0, p1, sampled), completion(1, p2, [7, IM_END], messages=later)]
    (found,) = build_trajectory("prefix_merging", comps, eos_token_id=IM_END).metadata["breaks"]
    assert found["cause"] == "history_rerendered" and found["first_difference"] == len(p1)
    assert found["expected_ids"] == list(range(1000, 1000 + RUN_WINDOW))
    assert found["found_ids"] == list(range(2000, 2000 + RUN_WINDOW))


@pytest.mark.parametrize("finish", ["length", "stop"])
def test_a_cut_reply_is_not_continued_in_messages_mode(finish: str) -> None:
    """Cut at max_tokens, or by a stop string: no end-of-turn id was sampled, the template closed the turn."""
    p1 = [*SYSTEM, *user_turn(200), *GEN]
    p2 = [*p1, 300, IM_END, NL, *user_turn(4), *GEN]
    p3 = [*p2, 310, 311, IM_END, NL, *user_turn(5), *GEN]  # the cut text re-rendered as the same ids, then closed
    comps = [completion(0, p1, [300, IM_END]), completion(1, p2, [310, 311], finish=finish),
             completion(2, p3, [320, IM_END])]  # fmt: skip
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert chains(traj) == [["c0", "c1"], ["c2"]]
    assert [b["cause"] for b in traj.metadata["breaks"]] == ["truncated_reply"]
    # the paper's rule continues it, the template's closing masked; the context holds, as the cut ids re-rendered
    loose = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge="prompt_prefix")
    assert chains(loose) == [["c0", "c1", "c2"]] and loose.traces[0].context_exact


def spliced(c: Completion, last: Completion, *, start: int | None = None, of: str | None = None) -> Completion:
    """``c`` as a tokens-mode call whose prompt spliced ``last``'s sampled ids right after ``last``'s prompt."""
    at = len(last.prompt_ids) if start is None else start
    spans = [PromptSpan(start=0, end=at, source="rendered"),
             PromptSpan(start=at, end=at + len(last.response_ids), source="spliced",
                        completion_id=of or last.completion_id),
             PromptSpan(start=at + len(last.response_ids), end=len(c.prompt_ids), source="rendered")]  # fmt: skip
    return c.model_copy(update={"token_mode": "tokens", "prompt_spans": spans})


def test_a_tokens_mode_prompt_that_spliced_the_cut_reply_continues_it() -> None:
    comps = three_turn_session()[1:]  # c1 cut at max_tokens; c2's prompt holds its ids, then the closing
    joined = [comps[0], spliced(comps[1], comps[0])]
    traj = build_trajectory("prefix_merging", joined, eos_token_id=IM_END)
    assert chains(traj) == [["c1", "c2"]]
    (trace,) = traj.traces
    p2, p3 = comps[0].prompt_ids, comps[1].prompt_ids
    assert decode_spans(trace)[:2] == [(1, [310, 311]), (0, p3[len(p2) + 2 :])]  # the closing <|im_end|> untrained
    assert trace.context_exact and verify(traj, joined, raise_on_violation=True).ok
    # a span of another completion, or at another place, proves nothing: the cut reply still breaks the chain
    for other in (spliced(comps[1], comps[0], of="c0"), spliced(comps[1], comps[0], start=3)):
        broken = build_trajectory("prefix_merging", [comps[0], other], eos_token_id=IM_END)
        assert chains(broken) == [["c1"], ["c2"]] and broken.metadata["breaks"][0]["cause"] == "truncated_reply"
    # a splice that claims the reply but holds other ids: the exact prefix does not hold
    wrong = comps[1].model_copy(update={"prompt_ids": [*p2, 310, 312, *p3[len(p2) + 2 :]]})
    assert chains(build_trajectory("prefix_merging", [comps[0], spliced(wrong, comps[0])],
                                   eos_token_id=IM_END)) == [["c1"], ["c2"]]  # fmt: skip


def test_prompt_prefix_marks_the_drifting_completion_and_its_successors() -> None:
    comps = drifting_session()
    loose = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge="prompt_prefix")
    (trace,) = loose.traces
    assert trace.metadata["completion_ids"] == ["c0", "c1", "c2", "c3"]
    assert trace.metadata["context_exact"] == [True, True, False, False] and not trace.context_exact
    assert loose.metadata["merge"] == "prompt_prefix" and loose.metadata["context_inexact_completions"] == 2
    report = verify(loose, comps)
    assert report.ok and any("as the trace says (context_exact: false)" in note for note in report.notes)
    again = Trace.model_validate_json(trace.model_dump_json())
    assert not again.context_exact
    # the default breaks where the prompt departed, and every trace is exact
    exact = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert chains(exact) == [["c0", "c1"], ["c2", "c3"]]
    (cut,) = exact.metadata["breaks"]
    assert cut["cause"] == "history_rerendered" and cut["first_difference"] == len(comps[1].prompt_ids) + 1
    assert cut["expected_ids"] == [311, IM_END] and cut["found_ids"][:2] == [399, IM_END]
    assert all(t.context_exact for t in exact.traces) and verify(exact, comps, raise_on_violation=True).ok


def test_a_trace_that_pretends_to_be_exact_fails_verify() -> None:
    comps = drifting_session()
    loose = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge="prompt_prefix")
    trace = loose.traces[0]
    pretending = trace.model_copy(update={"context_exact": True})
    report = verify(loose.model_copy(update={"traces": [pretending]}), comps)
    assert [(v.code, v.completion_id) for v in report.violations] == [("context", "c2"), ("context", "c3")]
    assert "the trace does not say so (context_exact)" in report.violations[0].message
    # the per-completion flags count too: a trace false overall but true for c2 is caught at c2
    flags = {**trace.metadata, "context_exact": [True, True, True, False]}
    half = trace.model_copy(update={"metadata": flags})
    report = verify(loose.model_copy(update={"traces": [half]}), comps)
    assert [(v.code, v.completion_id) for v in report.violations] == [("context", "c2")]


def test_per_request_traces_are_exact_under_either_rule() -> None:
    for merge in ("exact", "prompt_prefix"):
        traj = build_trajectory("per_request", drifting_session(), eos_token_id=IM_END, merge=merge)
        assert all(t.context_exact for t in traj.traces) and traj.metadata["context_inexact_completions"] == 0


def test_identical_parallel_samples_tie_break_to_the_most_recent_chain() -> None:
    p = [*SYSTEM, *user_turn(200), *GEN]
    comps = [completion(0, p, [310, IM_END]), completion(1, p, [310, IM_END]),
             completion(2, [*p, 310, IM_END, *user_turn(5), *GEN], [330, IM_END])]  # fmt: skip
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert chains(traj) == [["c0"], ["c1", "c2"]]
    assert verify(traj, comps, raise_on_violation=True).ok


def test_break_causes_and_roles_follow_the_chain_they_broke_from() -> None:
    traj = build_trajectory("prefix_merging", three_turn_session(), eos_token_id=IM_END,
                            context=BuildContext(harness="pi"))  # fmt: skip
    assert [(t.role, t.role_reason) for t in traj.traces] == [
        ("main", "the session's first chain"),
        ("main", "continues chain 0 (main) after a history_rerendered break"),
        ("main", "continues chain 1 (main) after a truncated_reply break"),
    ]
    assert {"truncated_reply", "reasoning_dropped", "history_rerendered"} <= set(BREAK_CAUSES)


def reasoning_dropped_session(*, on_purpose: bool) -> list[Completion]:
    """A tool call that reasoned (``<think> 500 </think>``, ids 151667 500 151668), then a tokens-mode prompt rendered
    whole by a template that drops it; ``on_purpose``: the proxy says so (``keep_reasoning: false``)."""
    p1 = [*SYSTEM, *user_turn(200, 201), *GEN]
    a1 = [151667, 500, 151668, NLNL, 300, 301, IM_END]
    p2 = [*p1, 300, 301, IM_END, NL, *user_turn(400), *GEN]
    answer1 = {"role": "assistant", "content": None, "reasoning_content": "500", "tool_calls": [call("run", "{}")]}
    m2 = [*TASK_MESSAGES, answer1, {"role": "user", "content": "400"}]
    built = {"base": "c0", "edited": False, "reasoning_dropped": on_purpose, "rendered_tokens": len(p2)}
    tokens: dict[str, Any] = {"token_mode": "tokens", "prompt_spans": [PromptSpan(start=0, end=len(p2),
                                                                                  source="rendered")]}  # fmt: skip
    return [completion(0, p1, a1, finish="tool_calls", messages=TASK_MESSAGES, answer=answer1, token_mode="tokens",
                       prompt_spans=[PromptSpan(start=0, end=len(p1), source="rendered")]),
            completion(1, p2, [310, IM_END], messages=m2, metadata={"token_prompt": built}, **tokens)]  # fmt: skip


def test_reasoning_dropped_on_purpose_breaks_with_its_cause() -> None:
    comps = reasoning_dropped_session(on_purpose=True)
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert chains(traj) == [["c0"], ["c1"]]
    (dropped,) = traj.metadata["breaks"]
    p1 = comps[0].prompt_ids
    assert dropped["cause"] == "reasoning_dropped" and dropped["closest_chain"] == 0
    assert dropped["first_difference"] == len(p1) and dropped["expected_ids"][:2] == [151667, 500]
    assert traj.traces[1].role == "main" and "reasoning_dropped" in (traj.traces[1].role_reason or "")
    assert verify(traj, comps, raise_on_violation=True).ok
    # the paper's rule joins it, and says the context differs
    loose = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge="prompt_prefix")
    assert chains(loose) == [["c0", "c1"]] and loose.traces[0].metadata["context_exact"] == [True, False]
    # without the proxy's word, the same prompts are a template's re-rendering
    unsaid = build_trajectory("prefix_merging", reasoning_dropped_session(on_purpose=False), eos_token_id=IM_END)
    assert [b["cause"] for b in unsaid.metadata["breaks"]] == ["history_rerendered"]


def test_merge_is_checked_config() -> None:
    assert BuilderConfig().merge == "exact"
    payload = shared_fixture("paper_task_payload.json")  # the paper's task asks for prefix_merging, no config
    builder = {**payload["builder"], "config": {"merge": "prompt_prefix"}}
    paper = TaskRequest.model_validate({**payload, "builder": builder})
    get_builder(paper.builder.strategy).check_config(paper.builder.config)
    with pytest.raises(ConfigError, match="merge"):
        get_builder("prefix_merging").check_config({"merge": "loose"})


def test_the_paper_fixture_reads_back_exact_and_continues_exactly() -> None:
    paper = Trace.model_validate(shared_fixture("paper_trace.json"))
    assert paper.context_exact  # written before the flag: the default
    sampled = completion(0, list(paper.prompt_ids), [785, 10042, IM_END], logprobs=[-0.21, -0.44, 0.0])
    follow = completion(1, [*paper.prompt_ids, 785, 10042, IM_END, *paper.response_ids[3:], *user_turn(9707), *GEN],
                        [1, IM_END])  # fmt: skip
    traj = build_trajectory("prefix_merging", [sampled, follow], eos_token_id=IM_END)
    (trace,) = traj.traces
    n = len(paper.response_ids)
    assert trace.response_ids[:n] == paper.response_ids and trace.loss_mask[:n] == paper.loss_mask
    assert trace.metadata["context_exact"] == [True, True]
