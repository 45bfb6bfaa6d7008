"""When the token prefix is ambiguous (parallel samples), messages decide which response a request continues."""

from __future__ import annotations

from polar_cli.builders import build_trajectory, verify
from polar_cli.builders.evidence import continues, normalized, replays_message
from tests.builders.helpers import GEN, IM_END, SYSTEM, SYSTEM_MESSAGE, completion, user_turn

P = [*SYSTEM, *user_turn(200), *GEN]
TASK = [SYSTEM_MESSAGE, {"role": "user", "content": "turn 0"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd":"ls"}'}}


def test_messages_compare_as_harnesses_replay_them() -> None:
    sampled = {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nOK ", "reasoning_content": "hmm",
               "tool_calls": [CALL]}
    replayed = {"role": "assistant", "content": [{"type": "text", "text": "OK"}],
                "tool_calls": [{"id": "other", "type": "function",
                                "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]}
    assert normalized(sampled) == normalized(replayed)
    first = completion(0, P, [310, IM_END], messages=TASK, answer=sampled)
    # text and tool call split into two assistant messages, as some harnesses send them
    split = [{"role": "assistant", "content": "OK"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    history = [*TASK, *split, {"role": "user", "content": "x"}]
    later = completion(1, [*P, 1, IM_END, *GEN], [5, IM_END], messages=history)
    assert replays_message(first, later) is True
    assert replays_message(first, completion(2, P, [5], messages=TASK)) is None


def test_without_contrary_evidence_the_prefix_rule_holds() -> None:
    """A harness that reshapes the replayed message beyond recognition still gets one chain (no sibling to blame)."""
    a = completion(0, P, [310, IM_END], messages=TASK, answer={"role": "assistant", "content": "A"})
    b = completion(1, [*P, 399, IM_END, *user_turn(5), *GEN], [330, IM_END],
                   messages=[*TASK, {"role": "assistant", "content": "A, reworded"}, {"role": "user", "content": "5"}])
    assert continues(a, b, frozenset([IM_END]), lambda: [a])
    traj = build_trajectory("prefix_merging", [a, b], eos_token_id=IM_END, merge="prompt_prefix")
    assert traj.metadata["chains"] == 1 and verify(traj, [a, b]).ok
    # b's prompt holds 399 where a sampled 310: the exact rule does not continue a, and says the history changed
    exact = build_trajectory("prefix_merging", [a, b], eos_token_id=IM_END)
    assert exact.metadata["chains"] == 2 and exact.metadata["prefix_break_causes"] == {"history_rewritten": 1}


def test_a_sibling_replayed_by_message_only_blocks_the_merge() -> None:
    """Re-serialized history (no token evidence for anyone): the replayed message names the branch."""
    a = completion(0, P, [310, IM_END], messages=TASK, answer={"role": "assistant", "content": "A"})
    b = completion(1, P, [320, IM_END], messages=TASK, answer={"role": "assistant", "content": "B"})
    c = completion(2, [*P, 399, IM_END, *user_turn(5), *GEN], [330, IM_END],
                   messages=[*TASK, {"role": "assistant", "content": "A"}, {"role": "user", "content": "5"}])
    assert continues(a, c, frozenset([IM_END]), lambda: [a, b])
    assert not continues(b, c, frozenset([IM_END]), lambda: [a, b])
    traj = build_trajectory("prefix_merging", [a, b, c], eos_token_id=IM_END, merge="prompt_prefix")
    assert [t.metadata["completion_ids"] for t in traj.traces] == [["c0", "c2"], ["c1"]]
    assert verify(traj, [a, b, c]).ok
    # the exact rule continues neither (399 was never sampled); the break names the sibling's branch
    exact = build_trajectory("prefix_merging", [a, b, c], eos_token_id=IM_END)
    assert [t.metadata["completion_ids"] for t in exact.traces] == [["c0"], ["c1"], ["c2"]]
    assert [b["cause"] for b in exact.metadata["breaks"]] == ["same_prompt", "other_branch"]
    assert verify(exact, [a, b, c]).ok
