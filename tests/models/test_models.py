from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from polar_cli.config import load_model_file
from polar_cli.errors import ConfigError
from polar_cli.models import Completion, TaskRequest, Trace, Trajectory, validate_model
from tests.conftest import shared_fixture


def roundtrip(model: type, data: dict) -> dict:
    obj = model.model_validate(data)
    text = obj.model_dump_json(exclude_unset=True)
    again = model.model_validate_json(text)
    assert again == obj
    return json.loads(text)


def test_paper_task_payload_validates_and_roundtrips() -> None:
    data = shared_fixture("paper_task_payload.json")
    assert roundtrip(TaskRequest, data) == data
    task = TaskRequest.model_validate(data)
    assert task.runtime.backend == "docker"
    assert task.agent.harness == "codex"
    assert task.evaluator.refresh_runtime is True
    assert task.metadata["policy_version"] == 3


def test_paper_trace_validates_and_roundtrips() -> None:
    """The paper's example omits ``token`` in its entries without text; validated, every entry has the three keys
    (``token`` None there) and the rest is unchanged."""
    data = shared_fixture("paper_trace.json")
    assert any("token" not in e for e in data["response_logprobs"])
    one_shape = [{"token": e.get("token"), "token_id": e["token_id"], "logprob": e["logprob"]}
                 for e in data["response_logprobs"]]  # fmt: skip
    assert roundtrip(Trace, data) == {**data, "response_logprobs": one_shape}
    trace = Trace.model_validate(data)
    assert trace.trainable_tokens == 3
    assert trace.response_logprobs == one_shape
    assert [list(e) for e in trace.response_logprobs] == [["token", "token_id", "logprob"]] * len(one_shape)


def test_misspelled_task_field_is_named(tmp_path) -> None:
    data = shared_fixture("paper_task_payload.json")
    data["runtime"]["imgae"] = data["runtime"].pop("image")
    path = tmp_path / "task.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_model_file(TaskRequest, path)
    message = str(info.value)
    assert "runtime.imgae" in message
    assert "did you mean 'image'" in message
    assert str(path) in message


def test_top_level_unknown_field_named() -> None:
    with pytest.raises(ConfigError, match="unknown field 'num_sample'"):
        validate_model(TaskRequest, {"task_id": "t", "instruction": "i", "agent": {"harness": "x"}, "num_sample": 2})


def test_yaml_task_file(tmp_path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text("task_id: t1\ninstruction: say hi\nagent:\n  harness: shell\n")
    task = load_model_file(TaskRequest, path)
    assert task.num_samples == 1 and task.builder.strategy == "prefix_merging"


def test_bad_yaml_names_file(tmp_path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text("task_id: [unclosed\n")
    with pytest.raises(ConfigError, match=r"task\.yaml: not valid YAML"):
        load_model_file(TaskRequest, path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"loss_mask": [1, 1]}, "loss_mask has 2 entries for 5 response_ids"),
        ({"loss_mask": [1, 1, 2, 0, 0]}, "loss_mask values must be 0 or 1"),
        ({"response_logprobs": [{"token_id": 785, "logprob": -0.1}]}, "response_logprobs has 1 entries"),
    ],
)
def test_trace_invariants(change: dict, message: str) -> None:
    data = shared_fixture("paper_trace.json") | change
    with pytest.raises(ValidationError, match=message):
        Trace.model_validate(data)


def test_trace_logprob_ids_must_align() -> None:
    data = shared_fixture("paper_trace.json")
    data["response_logprobs"][1]["token_id"] = 1
    with pytest.raises(ValidationError, match=r"response_logprobs\[1\].token_id is 1"):
        Trace.model_validate(data)


def test_trace_rejects_unknown_field() -> None:
    data = shared_fixture("paper_trace.json") | {"advantage": 1.0}
    with pytest.raises(ValidationError, match="advantage"):
        Trace.model_validate(data)


def test_completion_alignment() -> None:
    base = {
        "completion_id": "c0",
        "session_id": "s",
        "index": 0,
        "provider": "openai_chat",
        "model": "m",
        "request": {},
        "request_messages": [{"role": "user", "content": "hi"}],
        "response_message": {"role": "assistant", "content": "yo"},
        "prompt_ids": [1, 2],
        "response_ids": [3, 4],
        "response_logprobs": [-0.1, -0.2],
        "started_at": 0.0,
        "finished_at": 1.0,
    }
    assert Completion.model_validate(base).token_source == "backend"
    with pytest.raises(ValidationError, match="response_logprobs has 1 entries for 2"):
        Completion.model_validate(base | {"response_logprobs": [-0.1]})
    with pytest.raises(ValidationError):
        Completion.model_validate(base | {"token_source": "guessed"})


def test_trajectory_status_values() -> None:
    assert Trajectory(status="timeout").traces == []
    with pytest.raises(ValidationError):
        Trajectory.model_validate({"status": "finished"})
