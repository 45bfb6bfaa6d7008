"""Slime samples. Slime is not on PyPI (the PyPI ``slime`` is another project), so its ``Sample`` cannot be imported
here: the fields are checked against ``Sample`` as read in THUDM/slime ``slime/utils/types.py`` (and TRAINERS.md)."""

from __future__ import annotations

import math
import sys

import pytest

from polar_cli.errors import MissingLogprobError
from polar_cli.models import PolicyVersions, Trace
from polar_cli.trainers import slime_groups, slime_sample, slime_samples
from tests.conftest import shared_fixture
from tests.trainers.helpers import make_result, make_trace

SLIME_SAMPLE_FIELDS = {
    "group_index", "index", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs", "response",
    "response_length", "label", "reward", "loss_mask", "weight_versions", "rollout_log_probs",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "mopd_teacher_log_probs", "status", "metadata",
    "generate_function_path", "train_metadata", "session_id", "non_generation_time", "spec_info",
    "prefix_cache_info",
}  # fmt: skip
"""``Sample``'s dataclass fields (THUDM/slime ``slime/utils/types.py`` at commit 0d234f3); each has a default."""
SLIME_STATUS_NAMES = {"PENDING", "COMPLETED", "TRUNCATED", "ABORTED", "FAILED"}
TRAINERS_MD_FIELDS = {
    "group_index", "index", "prompt", "tokens", "response", "response_length", "label", "reward", "loss_mask",
    "rollout_log_probs", "remove_sample", "status", "metadata", "train_metadata", "session_id", "weight_versions",
}  # fmt: skip
"""The fields TRAINERS.md lists: Polar fills every one."""


def test_the_paper_trace_as_a_slime_sample() -> None:
    trace = Trace.model_validate(shared_fixture("paper_trace.json"))
    sample = slime_sample(trace, group_index=0, index=5)
    kwargs = sample.to_kwargs()
    assert set(kwargs) == TRAINERS_MD_FIELDS
    assert set(kwargs) <= SLIME_SAMPLE_FIELDS
    assert kwargs["status"] in SLIME_STATUS_NAMES
    assert kwargs["tokens"] == trace.prompt_ids + trace.response_ids
    assert kwargs["response_length"] == len(trace.response_ids) == len(kwargs["loss_mask"])
    assert kwargs["loss_mask"] == [1, 1, 1, 0, 0]
    assert kwargs["rollout_log_probs"] == [-0.21, -0.44, 0.0, 0.0, 0.0]
    assert kwargs["reward"] == 1.0
    assert kwargs["status"] == "COMPLETED"
    assert kwargs["session_id"] == "session-123"
    assert kwargs["prompt"] == trace.prompt_messages
    assert kwargs["response"] == "sampled assistant turn"
    assert (kwargs["group_index"], kwargs["index"], kwargs["remove_sample"]) == (0, 5, False)
    assert kwargs["metadata"]["task_id"] == "polar-swegym-0001"
    assert kwargs["metadata"]["polar"]["status"] == "COMPLETED"


def test_statuses_and_masks() -> None:
    truncated = slime_sample(make_trace([1, 1], finish="length"))
    assert (truncated.status, truncated.loss_mask) == ("TRUNCATED", [1, 1])
    aborted = slime_sample(make_trace([1, 0]), session_status="timeout")
    assert (aborted.status, aborted.loss_mask) == ("ABORTED", [1, 0])
    failed = slime_sample(make_trace([1, 0, 1]), session_status="error")
    assert (failed.status, failed.loss_mask, failed.rollout_log_probs) == ("FAILED", [0, 0, 0], [0.0, 0.0, 0.0])


def test_every_trainable_trace_of_a_session_is_a_sample_with_its_own_reward() -> None:
    main = make_trace([1, 0, 1], reward=1.0)
    side = make_trace([1], role="side", trainable=False, reward=None)
    sub = make_trace([1], role="subagent", reward=0.25, first_id=200)
    dropped = make_result([make_trace([1])], status="stale", session_id="s-stale", sample_index=1)
    failed = make_result([make_trace([1, 1], reward=0.0)], status="error", session_id="s-err", sample_index=2)
    out = slime_samples([failed, dropped, make_result([main, side, sub])], group_index=3, start_index=10)
    assert [(s.session_id, s.reward, s.status) for s in out] == [
        ("s-0", 1.0, "COMPLETED"),
        ("s-0", 0.25, "COMPLETED"),
        ("s-err", 0.0, "FAILED"),
    ]
    assert [s.index for s in out] == [10, 11, 12]
    assert {s.group_index for s in out} == {3}
    assert out[2].loss_mask == [0, 0]


def test_several_groups_index_across_them() -> None:
    a = [make_result([make_trace([1])], session_id=f"a{i}", sample_index=i) for i in range(2)]
    b = [make_result([make_trace([1])], session_id=f"b{i}", sample_index=i) for i in range(3)]
    out = slime_groups([a, b])
    assert [[(s.group_index, s.index) for s in group] for group in out] == [
        [(0, 0), (0, 1)],
        [(1, 2), (1, 3), (1, 4)],
    ]


def test_weight_versions_are_strings_of_the_completions_versions() -> None:
    versions = PolicyVersions(oldest=3, newest=4, per_completion=[3, None, 4])
    sample = slime_sample(make_trace([1]).model_copy(update={"policy_versions": versions}))
    assert sample.weight_versions == ["3", "4"]


def test_a_trainable_token_without_a_logprob_stops_the_conversion() -> None:
    result = make_result([make_trace([1, 1], logprobs=[-0.1, math.nan])], session_id="s-bad")
    with pytest.raises(MissingLogprobError, match=r"session s-bad: response token 1"):
        slime_samples(result)


def test_context_exact_goes_with_the_sample() -> None:
    from polar_cli.builders import build_trajectory
    from tests.builders.helpers import IM_END, drifting_session

    loose = build_trajectory("prefix_merging", drifting_session(), eos_token_id=IM_END, merge="prompt_prefix")
    sample = slime_sample(loose.traces[0])
    assert sample.metadata["polar"]["context_exact"] is False
    assert sample.metadata["context_exact"] == [True, True, False, False]  # the trace's own, per completion
    assert slime_sample(make_trace([1])).metadata["polar"]["context_exact"] is True


def test_to_native_without_slime_is_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slime is simulated absent (``sys.modules["slime"] = None`` makes its import fail as when it is not installed),
    so the check holds even on a machine that has it."""
    from polar_cli.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "slime", None)
    with pytest.raises(MissingDependencyError) as caught:
        slime_sample(make_trace([1])).to_native()
    assert str(caught.value) == (
        "SlimeSample.to_native needs slime: pip install slime (Slime is not on PyPI: install it from "
        "github.com/THUDM/slime)"
    )


def test_one_group_alone_is_a_list_of_one() -> None:
    a = [make_result([make_trace([1])], session_id=f"a{i}", sample_index=i) for i in range(2)]
    assert [[s.session_id for s in group] for group in slime_groups(a)] == [["a0", "a1"]]
