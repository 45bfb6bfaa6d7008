"""The rules every trainer adapter shares (polar_cli.trainers.rules)."""

from __future__ import annotations

import math
import sys

import pytest

from polar_cli.errors import AdapterError, MissingLogprobError, PolarError
from polar_cli.groups import Group
from polar_cli.models import PolicyVersions, Trace
from polar_cli.models.inference import VersionSpan
from polar_cli.trainers import (
    flat_logprobs,
    sample_status,
    samples,
    select_traces,
    token_versions,
    trace_sample,
    verl_trace_output,
)
from tests.conftest import shared_fixture
from tests.trainers.helpers import make_result, make_trace


def paper_trace() -> Trace:
    return Trace.model_validate(shared_fixture("paper_trace.json"))


def test_paper_trace_logprobs_are_flat_floats_aligned_with_the_response() -> None:
    trace = paper_trace()
    logprobs = flat_logprobs(trace)
    assert logprobs == [-0.21, -0.44, 0.0, 0.0, 0.0]
    assert len(logprobs) == len(trace.response_ids)
    assert all(type(v) is float for v in logprobs)


def test_mask_zero_tokens_get_zero_whatever_was_recorded() -> None:
    trace = make_trace([1, 0, 1], logprobs=[-0.5, -7.0, -0.25])
    assert flat_logprobs(trace) == [-0.5, 0.0, -0.25]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_trainable_token_without_a_finite_logprob_is_an_error_naming_session_and_position(bad: float) -> None:
    trace = make_trace([1, 0, 1], logprobs=[-0.5, 0.0, bad], metadata={"session_id": "sess-42"})
    with pytest.raises(MissingLogprobError, match=r"session sess-42: response token 2 \(id 102\)") as info:
        flat_logprobs(trace)
    assert isinstance(info.value, PolarError)


def test_a_trace_without_logprobs_is_an_error_only_when_it_has_trainable_tokens() -> None:
    trace = make_trace([0, 1, 1]).model_copy(update={"response_logprobs": None})
    with pytest.raises(MissingLogprobError, match=r"session s-9: response token 1 \(id 101\).*no response_logprobs"):
        flat_logprobs(trace, session_id="s-9")
    untrained = make_trace([0, 0]).model_copy(update={"response_logprobs": None})
    assert flat_logprobs(untrained) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("session", "finish", "status"),
    [
        ("completed", "stop", "COMPLETED"),
        ("completed", "tool_calls", "COMPLETED"),
        ("completed", None, "COMPLETED"),
        ("completed", "length", "TRUNCATED"),
        ("timeout", "stop", "ABORTED"),
        ("timeout", "length", "ABORTED"),
        ("limit", "stop", "ABORTED"),
        ("error", "stop", "FAILED"),
        ("stale", "stop", None),
        ("cancelled", "stop", None),
        ("no_model_call", None, None),
    ],
)
def test_status_mapping(session: str, finish: str | None, status: str | None) -> None:
    assert sample_status(session, finish) == status  # type: ignore[arg-type]


def test_a_failed_session_zeroes_the_mask_and_so_needs_no_logprob() -> None:
    trace = make_trace([1, 0, 1], logprobs=[math.nan, 0.0, math.nan])
    sample = trace_sample(trace, session_status="error")
    assert sample.status == "FAILED"
    assert sample.loss_mask == [0, 0, 0]
    assert sample.logprobs == [0.0, 0.0, 0.0]
    assert trace.loss_mask == [1, 0, 1]  # the trace itself is untouched


def test_an_aborted_session_keeps_its_mask() -> None:
    sample = trace_sample(make_trace([1, 1], finish="length"), session_status="timeout")
    assert (sample.status, sample.loss_mask) == ("ABORTED", [1, 1])


@pytest.mark.parametrize("status", ["stale", "cancelled", "no_model_call"])
def test_sessions_that_give_no_sample(status: str) -> None:
    result = make_result([make_trace([1])], status=status)  # type: ignore[arg-type]
    assert samples(result) == []
    with pytest.raises(AdapterError, match=f"a {status} session gives no training sample"):
        trace_sample(make_trace([1]), session_status=status)  # type: ignore[arg-type]


def test_only_trainable_traces_are_samples_each_with_its_own_reward() -> None:
    main = make_trace([1, 1], reward=1.0)
    sub = make_trace([1], role="subagent", reward=0.5)
    side = make_trace([1], role="side", trainable=False, reward=None)
    result = make_result([main, side, sub], session_id="s-3", sample_index=3)
    picked = samples(result, "each")
    assert [(s.trace_index, s.trace.role, s.reward) for s in picked] == [(0, "main", 1.0), (2, "subagent", 0.5)]
    assert {(s.session_id, s.sample_index, s.task_id) for s in picked} == {("s-3", 3, "task-1")}
    with pytest.raises(AdapterError, match="not trainable"):
        trace_sample(side)


def test_a_reward_of_none_stays_none() -> None:
    assert trace_sample(make_trace([1], reward=None)).reward is None


def test_trace_rules_main_last_main_each() -> None:
    first, second = make_trace([1], first_id=10), make_trace([1], first_id=20)
    sub = make_trace([1], role="subagent", first_id=30)
    result = make_result([first, sub, second], session_id="s-7")
    assert [i for i, _ in select_traces(result, "each")] == [0, 1, 2]
    assert [i for i, _ in select_traces(result, "last_main")] == [2]
    with pytest.raises(AdapterError, match=r"s-7: 2 trainable main traces.*last_main"):
        select_traces(result, "main")
    single = make_result([first, sub])
    assert [i for i, _ in select_traces(single, "main")] == [0]


def test_main_on_traces_without_roles() -> None:
    alone = make_result([make_trace([1], role=None), make_trace([1], role=None, trainable=False)])
    assert [i for i, _ in select_traces(alone, "main")] == [0]
    two = make_result([make_trace([1], role=None), make_trace([1], role=None)], session_id="old")
    with pytest.raises(AdapterError, match="old: 2 trainable traces without roles"):
        select_traces(two, "main")


def test_a_group_gives_its_usable_sessions_in_sample_order() -> None:
    results = [make_result([make_trace([1], first_id=10 * i)], session_id=f"s-{i}", sample_index=i) for i in (0, 1)]
    group = Group(task_id="task-1", num_samples=3, results=results, rewards=[1.0, 1.0])
    assert [s.session_id for s in samples(group)] == ["s-0", "s-1"]
    assert [s.session_id for s in samples(list(reversed(results)))] == ["s-0", "s-1"]


def test_importing_the_adapters_imports_no_trainer() -> None:
    import subprocess

    code = (
        "import sys, polar_cli.trainers; "
        "print(sorted(m for m in ('trl', 'torch', 'verl', 'slime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_token_versions_place_each_response_token_under_the_version_that_sampled_it() -> None:
    """What a trainer corrects the importance ratio with (TIS) when tokens come from older policies."""
    trace = make_trace([1, 1, 0, 1, 1, 1])
    assert token_versions(trace) == [None] * 6  # nothing recorded
    one = trace.model_copy(update={"policy_versions": PolicyVersions(oldest=3, newest=3, per_completion=[3])})
    assert token_versions(one) == [3] * 6
    spans = [VersionSpan(start=0, version=3), VersionSpan(start=2, version=4), VersionSpan(start=5, version=5)]
    crossed = trace.model_copy(update={"policy_versions": PolicyVersions(
        oldest=3, newest=5, per_completion=[3, 4], spans=spans)})  # fmt: skip
    assert token_versions(crossed) == [3, 3, 4, 4, 4, 5]
    unknown = [VersionSpan(start=0, version=3), VersionSpan(start=None, version=4), VersionSpan(start=4, version=5)]
    frozen = trace.model_copy(update={"policy_versions": PolicyVersions(
        oldest=3, newest=5, per_completion=[3, 4], spans=unknown)})  # fmt: skip
    assert token_versions(frozen) == [None, None, None, None, 5, 5]  # 3 or 4: nobody could tell where it changed
    polar = verl_trace_output(crossed).extra_fields["polar"]
    assert polar["policy_versions"] == [3, 4] and polar["token_versions"] == [3, 3, 4, 4, 4, 5]
