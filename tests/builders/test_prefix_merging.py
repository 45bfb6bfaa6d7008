from __future__ import annotations

import pytest

from polar_cli.builders import BuildContext, build_trajectory, verify
from polar_cli.errors import BuildError, ConfigError
from polar_cli.models import BuilderSpec, Trace
from polar_cli.registry import get_builder
from tests.builders.helpers import (
    GEN,
    IM_END,
    IM_START,
    NL,
    NLNL,
    SYSTEM,
    USER,
    completion,
    decode_spans,
    exact_session,
    three_turn_session,
    user_turn,
)
from tests.conftest import shared_fixture


def test_three_turn_session_merges_into_one_hand_checked_trace_under_the_papers_rule() -> None:
    comps = three_turn_session()
    context = BuildContext(session_id="s1", task_id="t1")
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, context=context, merge="prompt_prefix")
    assert traj.metadata["chains"] == traj.metadata["traces"] == 1
    (trace,) = traj.traces
    assert trace.prompt_ids == comps[0].prompt_ids
    assert decode_spans(trace) == [
        (1, [300, 301, 302, IM_END]),  # a1: the sampled tokens, not the re-rendered 300, 399, 302
        (0, [NL, IM_START, USER, NL, 400, IM_END, NL, IM_START, 77091, NL]),  # u1: after the first <|im_end|>
        (1, [310, 311]),  # a2, truncated
        (0, [IM_END, NL, IM_START, USER, NL, 401, 402, IM_END, NL, IM_START, 77091, NL]),  # u2 starts AT <|im_end|>
        (1, [320, IM_END]),  # a3
    ]
    assert trace.loss_mask == [1] * 4 + [0] * 10 + [1] * 2 + [0] * 12 + [1] * 2
    entries = trace.response_logprobs
    assert entries is not None
    trained = [(e["token_id"], e["logprob"]) for e, m in zip(entries, trace.loss_mask, strict=True) if m]
    assert trained == [(300, -0.1), (301, -0.2), (302, -0.3), (IM_END, -0.01), (310, -1.0), (311, -1.1),
                       (320, -2.0), (IM_END, -0.02)]
    masked = [e for e, m in zip(entries, trace.loss_mask, strict=True) if not m]
    assert all(e == {"token": None, "token_id": e["token_id"], "logprob": 0.0} for e in masked)
    assert {tuple(e) for e in entries} == {("token", "token_id", "logprob")}  # one shape, masked or not
    assert trace.finish_reason == "stop"
    assert trace.metadata["completion_ids"] == ["c0", "c1", "c2"]
    assert traj.metadata["trainable_tokens"] == 8 and traj.metadata["interstitial_tokens"] == 22
    # a2 follows the sampled a1 where its prompt held the re-rendering: neither it nor a3 is in its own context
    assert trace.metadata["context_exact"] == [True, False, False] and not trace.context_exact
    assert traj.metadata["merge"] == "prompt_prefix" and traj.metadata["context_inexact_completions"] == 2
    # The trace validates as a Trace (the builder skips the per-token loop, the model still accepts it).
    Trace.model_validate(trace.model_dump())
    assert verify(traj, comps).ok


def test_paper_appendix_trace_validates_and_our_trace_has_its_shape() -> None:
    data = shared_fixture("paper_trace.json")
    paper = Trace.model_validate(data)
    # The completion the paper's example trace was cut from: its sampled turn is the mask-1 run.
    sampled = completion(0, list(paper.prompt_ids), [785, 10042, IM_END], logprobs=[-0.21, -0.44, 0.0])
    report = verify(paper_trajectory := build_trajectory("per_request", [sampled]), [sampled])
    assert report.ok and len(paper_trajectory.traces) == 1
    from polar_cli.models import Trajectory

    assert verify(Trajectory(status="completed", traces=[paper]), [sampled]).ok

    follow = completion(1, [*paper.prompt_ids, 785, 10042, IM_END, NLNL, IM_START, USER, NL, 9707, IM_END, NL, *GEN],
                        [1, IM_END])
    context = BuildContext(session_id="session-123", task_id="polar-swegym-0001", harness="codex")
    ours = build_trajectory("prefix_merging", [sampled, follow], eos_token_id=IM_END, context=context).traces[0]
    n = len(paper.response_ids)
    assert ours.response_ids[:n] == paper.response_ids and ours.loss_mask[:n] == paper.loss_mask
    assert ours.response_logprobs is not None and paper.response_logprobs is not None
    # the same entries as the paper's (whose mask-0 ones, without "token", get token None when validated), and the
    # sampled ones without text (this completion has no response_tokens) have the same keys
    assert ours.response_logprobs[2:n] == paper.response_logprobs[2:n]
    assert all(list(e) == ["token", "token_id", "logprob"] for e in [*ours.response_logprobs, *paper.response_logprobs])
    assert [e["token"] for e in ours.response_logprobs[:n]] == [None] * n
    assert paper.metadata.items() <= ours.metadata.items()


@pytest.mark.parametrize("builder", ["per_request", "prefix_merging"])
def test_logprob_entries_have_one_shape_on_the_paper_fixture(builder: str) -> None:
    """Sampled tokens with their text, masked ones without: every entry has ``token``, ``token_id`` and ``logprob``
    (``token`` None where no text is known), built or read back from JSON."""
    paper = Trace.model_validate(shared_fixture("paper_trace.json"))
    assert paper.response_logprobs is not None
    texts = [e["token"] for e in paper.response_logprobs[:2]]
    sampled = completion(0, list(paper.prompt_ids), [785, 10042, IM_END], logprobs=[-0.21, -0.44, 0.0],
                         response_tokens=[*texts, "<|im_end|>"])  # fmt: skip
    follow = completion(1, [*paper.prompt_ids, 785, 10042, IM_END, NLNL, IM_START, USER, NL, 9707, IM_END, NL, *GEN],
                        [1, IM_END], response_tokens=["!", "<|im_end|>"])  # fmt: skip
    traces = build_trajectory(builder, [sampled, follow], eos_token_id=IM_END).traces
    for trace in [*traces, *(Trace.model_validate_json(t.model_dump_json()) for t in traces)]:
        entries = trace.response_logprobs
        assert entries is not None and {tuple(e) for e in entries} == {("token", "token_id", "logprob")}
        for e, m in zip(entries, trace.loss_mask, strict=True):
            assert (e["token"] is not None) == bool(m), e
    first = traces[0].response_logprobs
    assert first is not None and first[:2] == paper.response_logprobs[:2]


def test_every_completion_lands_in_exactly_one_chain_when_prefixes_break() -> None:
    p1 = [*SYSTEM, *user_turn(200), *GEN]
    sub = [IM_START, 8948, NL, 555, IM_END, NL, *user_turn(201), *GEN]  # a sub-agent: another system prompt
    p2 = [*p1, 300, IM_END, NL, *user_turn(400), *GEN]
    compacted = [*SYSTEM, *user_turn(200, 777), *GEN]  # history replaced by a summary
    comps = [
        completion(0, p1, [300, IM_END]),
        completion(1, sub, [600, IM_END], messages=[{"role": "system", "content": "sub-agent"}]),
        completion(2, p2, [301, IM_END]),
        completion(3, [*sub, 600, IM_END, NL, *user_turn(9), *GEN], [601, IM_END]),
        completion(4, compacted, [302, IM_END]),
        completion(5, p1, [303, IM_END]),  # a parallel sample of the first prompt
    ]
    traj = build_trajectory("prefix_merging", comps, eos_token_id=[IM_END])
    chains = [t.metadata["completion_ids"] for t in traj.traces]
    assert chains == [["c0", "c2"], ["c1", "c3"], ["c4"], ["c5"]]
    assert traj.metadata["completions_per_chain"] == [2, 2, 1, 1]
    causes = {b["completion_id"]: b["cause"] for b in traj.metadata["breaks"]}
    assert causes == {"c1": "new_context", "c4": "history_rewritten", "c5": "same_prompt"}
    assert traj.metadata["prefix_breaks"] == 3
    assert verify(traj, comps, raise_on_violation=True).ok


def test_parallel_branches_tie_break_and_longest_match() -> None:
    p = [*SYSTEM, *user_turn(200), *GEN]
    a, b = [310, IM_END], [320, IM_END]
    ans = {"role": "assistant", "content": "B"}
    history = [{"role": "user", "content": "turn 0"}]
    comps = [
        completion(0, p, a, messages=history, answer={"role": "assistant", "content": "A"}),
        completion(1, p, b, messages=history, answer=ans),
        # continues branch B (the later one): ties with A's chain on prompt length, wins on evidence
        completion(2, q := [*p, 320, IM_END, NL, *user_turn(5), *GEN], [330, IM_END],
                   messages=[*history, ans, {"role": "user", "content": "5"}]),
        # extends both chain 0's last prompt (p) and chain 1's (q): the longest wins
        completion(3, [*q, 330, IM_END, NL, *user_turn(6), *GEN], [340, IM_END]),
    ]
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert [t.metadata["completion_ids"] for t in traj.traces] == [["c0"], ["c1", "c2", "c3"]]
    assert traj.metadata["breaks"][0]["cause"] == "same_prompt"
    assert verify(traj, comps).ok


def test_extension_without_end_of_turn_starts_a_chain() -> None:
    p = [*SYSTEM, *user_turn(200), *GEN]
    comps = [completion(0, p, [310, 311]), completion(1, [*p, 310, 311], [312, IM_END])]  # continuation prefill
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert traj.metadata["chains"] == 2
    assert traj.metadata["prefix_break_causes"] == {"no_end_of_turn": 1}
    assert verify(traj, comps).ok


def test_without_config_the_end_of_turn_id_is_read_from_the_completions() -> None:
    comps = three_turn_session()  # each ends with <|im_end|> and finish reason stop
    traj = build_trajectory("prefix_merging", comps)
    assert traj.metadata["end_of_turn_ids"] == [IM_END] and traj.metadata["end_of_turn_source"] == "completions"
    assert traj.traces[0].metadata["end_of_turn_source"] == "completions"
    configured = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert [decode_spans(t) for t in traj.traces] == [decode_spans(t) for t in configured.traces]
    assert verify(traj, comps).ok
    # a truncated completion says nothing about the end-of-turn token and is left out
    truncated = [*comps[:2], comps[2].model_copy(update={"response_ids": [330], "response_logprobs": [-1.0],
                                                         "finish_reason": "length"})]  # fmt: skip
    assert build_trajectory("prefix_merging", truncated).metadata["end_of_turn_ids"] == [IM_END]


def test_missing_end_of_turn_id_says_how_to_pass_it() -> None:
    only_truncated = [completion(0, [1, 2], [3, 4], finish="length")]
    with pytest.raises(BuildError, match=r"no recorded completion ended with finish reason stop.*eos_token_id="):
        build_trajectory("prefix_merging", only_truncated)
    disagreeing = [completion(0, [1, 2], [3, IM_END]), completion(1, [1, 2, 3, IM_END, 5], [6, 7])]
    with pytest.raises(BuildError, match=rf"end with different tokens: {IM_END} \(1x\), 7 \(1x\).*eos_token_id="):
        build_trajectory("prefix_merging", disagreeing)
    assert build_trajectory("prefix_merging", []).traces == []  # an empty session needs no end-of-turn id


def test_retokenized_completions_are_refused_unless_allowed() -> None:
    comps = [c.model_copy(update={"token_source": "retokenized"}) for c in three_turn_session()]
    for strategy in ("prefix_merging", "per_request"):
        with pytest.raises(BuildError, match=r"re-tokenized.*allow_retokenized=True"):
            build_trajectory(strategy, comps, eos_token_id=IM_END)
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, allow_retokenized=True)
    assert traj.traces[0].metadata["token_source"] == "retokenized"


def test_bad_config_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"unknown field 'eos_token_ids' \(did you mean 'eos_token_id'\?\)"):
        build_trajectory("prefix_merging", three_turn_session(), eos_token_ids=IM_END)


def test_completions_of_two_sessions_are_refused() -> None:
    comps = [completion(0, [1], [2, IM_END]), completion(1, [1], [3, IM_END], session="other")]
    with pytest.raises(BuildError, match="2 sessions"):
        build_trajectory("prefix_merging", comps, eos_token_id=IM_END)


def test_metadata_carries_session_task_and_task_metadata() -> None:
    comps = three_turn_session()
    task_metadata = {"group_id": "rollout-0-group-0", "policy_version": 3, "rollout_step": 12}
    context = BuildContext(task_id="t9", harness="codex", task_metadata=task_metadata)
    spec = BuilderSpec(strategy="prefix_merging", config={"eos_token_id": IM_END})
    traj = build_trajectory(spec.strategy, comps, context=context, **spec.config)  # what the gateway does
    assert traj.session_id == "s1"
    expected = {"session_id": "s1", "task_id": "t9", "builder": "prefix_merging", "harness": "codex", **task_metadata}
    assert expected.items() <= traj.traces[0].metadata.items()
    assert traj.traces[0].metadata["end_of_turn_source"] == "eos_token_id"
    # Without a context, ids come from the completions' own metadata.
    tagged = [c.model_copy(update={"metadata": {"task_id": "t2", "task_metadata": {"group_id": "g"}}}) for c in comps]
    meta = build_trajectory("per_request", tagged).traces[0].metadata
    assert meta["task_id"] == "t2" and meta["group_id"] == "g" and meta["builder"] == "per_request"


def test_session_fields_are_context_not_config() -> None:
    for field in ("session_id", "task_id", "harness", "task_metadata", "status"):
        with pytest.raises(ConfigError, match=rf"unknown field '{field}'"):
            get_builder("prefix_merging").check_config({field: "x"})


def test_empty_session_and_status() -> None:
    context = BuildContext(session_id="s", status="timeout")
    traj = build_trajectory("prefix_merging", [], eos_token_id=IM_END, context=context)
    assert traj.traces == [] and traj.status == "timeout" and traj.metadata["chains"] == 0


def test_completions_are_taken_in_capture_order_and_verify_flag_runs() -> None:
    comps = exact_session()
    traj = build_trajectory("prefix_merging", comps[::-1], eos_token_id=IM_END, verify=True)
    assert traj.traces[0].metadata["completion_indices"] == [0, 1, 2]


def test_missing_logprobs_give_a_trace_without_logprobs() -> None:
    comps = exact_session()
    comps[1] = comps[1].model_copy(update={"response_logprobs": None})
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert traj.traces[0].response_logprobs is None
    report = verify(traj, comps)
    assert report.ok and not report.logprobs_checked and report.notes


def test_built_trajectory_round_trips_through_json_validation() -> None:
    from polar_cli.models import Trajectory

    traj = build_trajectory("prefix_merging", three_turn_session(), eos_token_id=IM_END)
    again = Trajectory.model_validate_json(traj.model_dump_json())  # the full validators run on external input
    assert again == traj


def test_an_empty_response_keeps_the_template_close_untrained() -> None:
    p1 = [*SYSTEM, *user_turn(200), *GEN]
    p2 = [*p1, IM_END, NL, *user_turn(7), *GEN]  # the template closes the empty turn
    p3 = [*p2, 320, IM_END, NL, *user_turn(8), *GEN]
    comps = [completion(0, p1, [], logprobs=[], finish="length"), completion(1, p2, [320, IM_END]),
             completion(2, p3, [330, IM_END])]
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge="prompt_prefix")
    (trace,) = traj.traces
    assert decode_spans(trace) == [(0, [IM_END, NL, *user_turn(7), *GEN]), (1, [320, IM_END]),
                                   (0, [NL, *user_turn(8), *GEN]), (1, [330, IM_END])]
    assert trace.context_exact  # the empty reply re-rendered as nothing: every context is the prompt
    assert verify(traj, comps).ok
    # the exact rule does not continue a cut reply (messages mode): the empty one stays alone
    exact = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert [t.metadata["completion_ids"] for t in exact.traces] == [["c0"], ["c1", "c2"]]
    assert exact.metadata["prefix_break_causes"] == {"truncated_reply": 1}
    assert verify(exact, comps).ok
