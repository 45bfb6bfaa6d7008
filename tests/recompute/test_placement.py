"""Where ``--device`` puts a model (polar_cli.recompute.placement): the decisions for the GPUs a machine has, as a
pure function of their memory, so that they are tested without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_cli.errors import ConfigError
from polar_cli.recompute.placement import GIB, DeviceSpec, Placement, model_bytes, parse_device, place

H200 = 141 * GIB


@pytest.mark.parametrize(
    ("value", "spec"),
    [
        ("auto", DeviceSpec("auto")),
        ("CPU", DeviceSpec("cpu")),
        ("cuda", DeviceSpec("cuda")),
        ("cuda:3", DeviceSpec("cuda", 3)),
    ],
)
def test_device_strings(value: str, spec: DeviceSpec) -> None:
    assert parse_device(value) == spec and str(parse_device(str(spec))) == str(spec)


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "cpu:0", "auto:1", "cuda:0,1", ""])
def test_a_bad_device_string_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match=f"^--device {value!r}: one of auto, cpu, cuda, cuda:N"):
        parse_device(value)


@pytest.mark.parametrize(
    ("device", "gpus", "weights", "accelerate", "placement"),
    [
        ("auto", [], 30 * GIB, True, Placement("cpu")),
        ("cpu", [H200], 30 * GIB, True, Placement("cpu")),
        ("auto", [H200], 30 * GIB, False, Placement("cuda:0", gpus=1)),
        ("cuda:1", [H200, H200], 30 * GIB, False, Placement("cuda:1", gpus=1)),
        ("cuda", [H200, H200], 30 * GIB, True, Placement("cuda:0", gpus=1)),  # fits the first: no spreading
        ("cuda", [H200] * 4, 130 * GIB, True, Placement("cuda:0", device_map="auto", gpus=4)),  # 32B in float32
        ("cuda", [H200], 130 * GIB, False, Placement("cuda:0", gpus=1)),  # one GPU: tight, but it may fit
    ],
)
def test_placement(device: str, gpus: list[int], weights: int, accelerate: bool, placement: Placement) -> None:
    assert place(parse_device(device), gpus, weights, accelerate=accelerate, dtype="float32") == placement


@pytest.mark.parametrize(
    ("device", "gpus", "weights", "accelerate", "message"),
    [
        ("cuda", [], GIB, True, "--device cuda: torch sees no GPU"),
        ("cuda:2", [H200, H200], GIB, True, "--device cuda:2: torch sees 2 GPU(s), cuda:0 to cuda:1"),
        ("cuda:0", [H200], 260 * GIB, True, "--device cuda:0: the weights (~260.0 GiB in float32) do not fit its 141"),
        ("cuda", [H200], 260 * GIB, True, "do not fit the one GPU torch sees (141 GiB); try --dtype bfloat16"),
        ("cuda", [H200] * 2, 300 * GIB, True, "do not fit the 2 GPUs torch sees together (282 GiB)"),
        ("auto", [H200] * 2, 130 * GIB, False, "spreading them across the 2 GPUs needs accelerate: pip install"),
    ],
)
def test_placements_that_cannot_be(device: str, gpus: list[int], weights: int, accelerate: bool, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        place(parse_device(device), gpus, weights, accelerate=accelerate, dtype="float32")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_model_bytes_scale_from_the_stored_dtype(tmp_path: Path) -> None:
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 600)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 400)
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert model_bytes(tmp_path, 4) == 2000 and model_bytes(tmp_path, 2) == 1000
    (tmp_path / "config.json").write_text("{}")  # no dtype named: float32
    assert model_bytes(tmp_path, 2) == 500
