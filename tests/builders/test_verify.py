"""``verify`` catches each way a trajectory can break the token-faithfulness contract."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from polar_cli.builders import build_trajectory, verify
from polar_cli.errors import VerificationError
from polar_cli.models import Completion, TokenLogprob, Trace, Trajectory
from tests.builders.helpers import GEN, IM_END, SYSTEM, SYSTEM_MESSAGE, completion, three_turn_session, user_turn


def merged(comps: list[Completion]) -> Trajectory:
    """Under the paper's rule, so that the three-turn session is one trace holding every shape the checks are about
    (a re-rendered tool call, a truncated reply); the trace says it is not context-exact."""
    return build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge="prompt_prefix")


def edit(traj: Trajectory, change: Callable[[Trace], None], index: int = 0) -> Trajectory:
    """A copy of ``traj`` with ``change`` applied to one trace, bypassing validation (as external data might)."""
    copy = traj.model_copy(deep=True)
    change(copy.traces[index])
    return copy


def codes(traj: Trajectory, comps: list[Completion]) -> set[str]:
    report = verify(traj, comps)
    assert report.ok == (not report.violations) and report.violation_count >= len(report.violations)
    return {v.code for v in report.violations}


def entries(ids: list[int], logprobs: list[float]) -> list[TokenLogprob]:
    return [TokenLogprob(token_id=t, logprob=lp) for t, lp in zip(ids, logprobs, strict=True)]


def set_mask(position: int, value: int) -> Callable[[Trace], None]:
    def change(trace: Trace) -> None:
        trace.loss_mask[position] = value

    return change


def test_a_correct_trajectory_passes_with_counts() -> None:
    comps = three_turn_session()
    report = verify(merged(comps), comps)
    assert report.ok and report.violation_count == 0 and report.logprobs_checked
    assert report.placed_completions == 3 and report.sampled_tokens == report.trainable_tokens == 8
    assert report.interstitial_tokens == 22 and report.summary().startswith("0 violation(s)")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # an interstitial token made trainable: trains on a token the policy never sampled
        (set_mask(4, 1), {"unsampled_trainable"}),
        # a sampled <|im_end|> masked out: that turn is no longer trained whole, and a real logprob sits on mask 0
        (set_mask(3, 0), {"unsampled_trainable", "missing", "sampled_interstitial"}),
    ],
)
def test_mask_flips_are_caught(change: Callable[[Trace], None], expected: set[str]) -> None:
    comps = three_turn_session()
    assert codes(edit(merged(comps), change), comps) == expected


def test_wrong_logprob_and_token_text_are_caught() -> None:
    comps = [c.model_copy(update={"response_tokens": [f"t{i}" for i in c.response_ids]}) for c in three_turn_session()]
    traj = merged(comps)

    def logprob(trace: Trace) -> None:
        assert trace.response_logprobs is not None
        trace.response_logprobs[1] = TokenLogprob(token="t301", token_id=301, logprob=-9.0)

    def text(trace: Trace) -> None:
        assert trace.response_logprobs is not None
        trace.response_logprobs[1] = TokenLogprob(token="other", token_id=301, logprob=-0.2)

    def placeholder(trace: Trace) -> None:
        assert trace.response_logprobs is not None
        trace.response_logprobs[5] = TokenLogprob(token_id=trace.response_ids[5], logprob=-1.5)

    assert codes(edit(traj, logprob), comps) == {"logprob_mismatch"}
    assert codes(edit(traj, text), comps) == {"token_text_mismatch"}
    assert codes(edit(traj, placeholder), comps) == {"sampled_interstitial"}


def test_dropped_and_duplicated_traces_are_caught() -> None:
    comps = three_turn_session()
    per_request = build_trajectory("per_request", comps)
    dropped = per_request.model_copy(update={"traces": per_request.traces[:2]})
    assert codes(dropped, comps) == {"missing"}
    doubled = per_request.model_copy(update={"traces": [*per_request.traces, per_request.traces[0]]})
    assert codes(doubled, comps) == {"duplicated"}


def test_re_rendered_tokens_in_place_of_sampled_ones_are_caught() -> None:
    """The mistake prefix merging exists to avoid: training on the next prompt's re-rendering of a turn."""
    comps = three_turn_session()

    def rerendered(trace: Trace) -> None:
        trace.response_ids[1] = 399  # what the template rendered, not what was sampled
        assert trace.response_logprobs is not None
        trace.response_logprobs[1] = TokenLogprob(token_id=399, logprob=-0.2)

    assert codes(edit(merged(comps), rerendered), comps) == {"unsampled_trainable", "missing"}


def test_wrong_context_is_caught() -> None:
    comps = three_turn_session()
    per_request = build_trajectory("per_request", comps)

    def prompt(trace: Trace) -> None:
        trace.prompt_ids = [*trace.prompt_ids[:-1], 7]

    assert codes(edit(per_request, prompt, 1), comps) == {"context"}

    def interstitial(trace: Trace) -> None:
        trace.response_ids[6] = 9  # a mask-0 token that is not in the next prompt
        assert trace.response_logprobs is not None
        trace.response_logprobs[6] = TokenLogprob(token_id=9, logprob=0.0)

    assert codes(edit(merged(comps), interstitial), comps) == {"context"}


def test_a_merge_onto_a_sibling_branch_is_caught() -> None:
    """Two samples of one prompt; the next call continues the first. Appending it to the second's trace (which the
    bare strict-prefix rule allows) puts the wrong response in its context."""
    p = [*SYSTEM, *user_turn(200), *GEN]
    first = {"role": "assistant", "content": "A"}
    comps = [
        completion(0, p, [310, IM_END], answer=first),
        completion(1, p, [320, IM_END], answer={"role": "assistant", "content": "B"}),
        completion(2, [*p, 310, IM_END, *user_turn(5), *GEN], [330, IM_END],
                   messages=[SYSTEM_MESSAGE, {"role": "user", "content": "turn 0"}, first,
                             {"role": "user", "content": "5"}]),
    ]
    good = merged(comps)
    assert [t.metadata["completion_ids"] for t in good.traces] == [["c0", "c2"], ["c1"]]
    assert verify(good, comps).ok
    u = [*user_turn(5), *GEN]
    lp = [c.response_logprobs or [] for c in comps]
    alone = Trace(prompt_ids=p, response_ids=[310, IM_END], loss_mask=[1, 1],
                  response_logprobs=entries([310, IM_END], lp[0]))
    ids = [320, IM_END, *u, 330, IM_END]
    wrong = Trace(prompt_ids=p, response_ids=ids, loss_mask=[1, 1, *[0] * len(u), 1, 1],
                  response_logprobs=entries(ids, [*lp[1], *[0.0] * len(u), *lp[2]]))
    bad = Trajectory(status="completed", traces=[alone, wrong])
    report = verify(bad, comps)
    assert {v.code for v in report.violations} == {"context"}
    assert "another response" in report.violations[0].message


def test_misaligned_external_trace_is_reported_not_crashed_on() -> None:
    comps = three_turn_session()
    broken = Trace.model_construct(prompt_ids=[1], response_ids=[1, 2], loss_mask=[1], response_logprobs=None)
    assert "misaligned" in codes(Trajectory.model_construct(status="completed", traces=[broken]), comps)


def test_raise_on_violation() -> None:
    comps = three_turn_session()
    with pytest.raises(VerificationError, match=r"violation\(s\).*appear in no trace"):
        verify(Trajectory(status="completed"), comps, raise_on_violation=True)
    report = verify(Trajectory(status="completed"), comps, max_violations=1)
    assert report.violation_count == 3 and len(report.violations) == 1
