"""``agent.sampling``: optional, strict numbers in their ranges, unknown fields refused, and a task with it survives
the trip through JSON (as it travels from the server to a gateway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar_cli.config import load_model_file
from polar_cli.errors import ConfigError
from polar_cli.models import SamplingSpec, TaskRequest, validate_model


def task(sampling: Any) -> dict[str, Any]:
    return {"task_id": "t", "instruction": "i", "agent": {"harness": "shell", "sampling": sampling}}


def test_a_yaml_task_with_sampling(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(
        "task_id: t\ninstruction: i\nagent:\n  harness: shell\n"
        "  sampling: {temperature: 1, top_p: 0.95, top_k: -1, max_tokens: 2048, seed: 0}\n"
    )
    spec = load_model_file(TaskRequest, path).agent.sampling
    assert spec == SamplingSpec(temperature=1.0, top_p=0.95, top_k=-1, max_tokens=2048, seed=0)
    assert spec is not None and spec.forced() == {"temperature": 1.0, "top_p": 0.95, "top_k": -1, "max_tokens": 2048,
                                                  "seed": 0}  # fmt: skip
    again = TaskRequest.model_validate_json(load_model_file(TaskRequest, path).model_dump_json())
    assert again.agent.sampling == spec


def test_everything_is_optional() -> None:
    assert validate_model(TaskRequest, task(None)).agent.sampling is None
    spec = validate_model(TaskRequest, task({})).agent.sampling
    assert spec is not None and spec.forced() == {}
    assert validate_model(TaskRequest, task({"top_k": 40})).agent.sampling == SamplingSpec(top_k=40)


@pytest.mark.parametrize(
    ("sampling", "named"),
    [
        ({"temperature": -1}, "agent.sampling.temperature"),
        ({"temperature": float("inf")}, "agent.sampling.temperature"),
        ({"temperature": "0.7"}, "agent.sampling.temperature"),
        ({"top_p": 0}, "agent.sampling.top_p"),
        ({"top_p": 1.01}, "agent.sampling.top_p"),
        ({"top_k": 0}, "agent.sampling.top_k"),
        ({"top_k": -2}, "agent.sampling.top_k"),
        ({"top_k": 2.5}, "agent.sampling.top_k"),
        ({"max_tokens": 0}, "agent.sampling.max_tokens"),
        ({"max_tokens": True}, "agent.sampling.max_tokens"),
        ({"seed": 2**63}, "agent.sampling.seed"),
        ({"stop": ["x"]}, "agent.sampling.stop"),
    ],
)
def test_a_bad_value_names_the_field(sampling: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        validate_model(TaskRequest, task(sampling))
