from __future__ import annotations

from polar_cli.builders import BuildContext, build_trajectory, verify
from polar_cli.registry import get_builder
from tests.builders.helpers import IM_END, completion, three_turn_session


def test_one_trace_per_completion_with_its_own_tokens() -> None:
    comps = three_turn_session()
    context = BuildContext(task_id="t1", harness="pi", task_metadata={"group_id": "g"})
    traj = build_trajectory("per_request", comps, context=context)
    assert len(traj.traces) == 3 and traj.metadata["traces"] == 3
    for trace, c in zip(traj.traces, comps, strict=True):
        assert trace.prompt_ids == c.prompt_ids and trace.response_ids == c.response_ids
        assert trace.loss_mask == [1] * len(c.response_ids)
        assert trace.response_logprobs is not None
        assert [e["logprob"] for e in trace.response_logprobs] == c.response_logprobs
        assert trace.prompt_messages == c.request_messages and trace.response_messages == [c.response_message]
        assert trace.finish_reason == c.finish_reason
        assert trace.metadata["completion_id"] == c.completion_id
        assert trace.metadata | {"group_id": "g", "task_id": "t1", "harness": "pi", "builder": "per_request"} == (
            trace.metadata
        )
    assert traj.metadata["trainable_tokens"] == sum(len(c.response_ids) for c in comps)
    assert verify(traj, comps).ok


def test_needs_no_end_of_turn_id_and_keeps_missing_logprobs_missing() -> None:
    c = completion(0, [1, 2], [3, IM_END], response_tokens=["a", "<|im_end|>"])
    bare = c.model_copy(update={"response_logprobs": None, "index": 1, "completion_id": "c1"})
    traj = build_trajectory("per_request", [c, bare])
    assert traj.traces[0].response_logprobs is not None
    assert [e["token"] for e in traj.traces[0].response_logprobs] == ["a", "<|im_end|>"]
    assert traj.traces[1].response_logprobs is None
    assert traj.metadata["missing_logprobs"] == 1


def test_registered_as_plugins() -> None:
    assert get_builder("per_request").name == "per_request"
    assert get_builder("prefix_merging").name == "prefix_merging"
