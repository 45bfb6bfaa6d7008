"""Where ``polar verify --recompute`` runs a model: ``--device auto|cpu|cuda|cuda:N`` parsed (``parse_device``, no
torch needed) and resolved (``place``, a pure function of the GPUs torch sees and the model's size).

- ``cpu``: the CPU.
- ``cuda:N``: GPU N alone.
- ``cuda``: the first GPU when the weights fit it with room for the activations and the KV cache (``FIT`` of its
  memory); otherwise every visible GPU, the layers spread across them by transformers' ``device_map="auto"``, which
  needs accelerate.
- ``auto`` (the default): ``cuda`` when torch sees a GPU, else ``cpu``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from polar_cli.errors import ConfigError

DEVICES = "auto, cpu, cuda, cuda:N (N: a GPU index)"
FIT = 0.8
"""The share of a GPU's memory the weights may take for the model to go on that GPU alone."""
GIB = 1 << 30
STORED_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
_DEVICE = re.compile(r"(auto|cpu|cuda)(?::(\d+))?")


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed ``--device``: its kind, and the GPU index of ``cuda:N``."""

    kind: Literal["auto", "cpu", "cuda"]
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


@dataclass(frozen=True)
class Placement:
    """How a model is loaded: onto ``device`` alone, or across ``gpus`` GPUs (``device_map``, the inputs going to
    ``device``, the first)."""

    device: str
    device_map: str | None = None
    gpus: int = 0

    def __str__(self) -> str:
        return f"{self.device_map} across {self.gpus} GPUs" if self.device_map else self.device


def parse_device(value: str) -> DeviceSpec:
    """``value`` as a DeviceSpec; ConfigError naming it when it is none of auto, cpu, cuda, cuda:N."""
    match = _DEVICE.fullmatch(value.strip().lower())
    if match is None or (match[2] is not None and match[1] != "cuda"):
        raise ConfigError(f"--device {value!r}: one of {DEVICES}")
    kind = cast(Literal["auto", "cpu", "cuda"], match[1])
    return DeviceSpec(kind, None if match[2] is None else int(match[2]))


def model_bytes(path: Path, itemsize: int) -> int:
    """An estimate of the memory the weights in model folder ``path`` take at ``itemsize`` bytes per parameter: their
    files' size, scaled from the dtype they are stored in (config.json's ``dtype``/``torch_dtype``; float32 when it
    names none)."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    stored = 4
    try:
        config = json.loads((path / "config.json").read_text())
        stored = STORED_ITEMSIZE.get(str(config.get("dtype") or config.get("torch_dtype") or "float32"), 4)
    except (OSError, ValueError, AttributeError):
        pass
    return sum(f.stat().st_size for f in files) * itemsize // stored


def place(spec: DeviceSpec, gpu_memory: Sequence[int], weights: int, *, accelerate: bool, dtype: str) -> Placement:
    """Where a model whose weights take ``weights`` bytes goes under ``spec``, given the total memory of each GPU
    torch sees (``gpu_memory``, empty without one) and whether accelerate is installed. ConfigError, naming the
    device, for a GPU that is not there or weights that fit no placement."""
    if spec.kind == "cpu" or (spec.kind == "auto" and not gpu_memory):
        return Placement("cpu")
    if not gpu_memory:
        raise ConfigError(f"--device {spec}: torch sees no GPU (torch.cuda.is_available() is false: a CPU-only torch "
                          "build, or no CUDA device visible); use --device cpu")  # fmt: skip
    size = f"the weights (~{weights / GIB:.1f} GiB in {dtype})"
    if spec.index is not None:
        if spec.index >= len(gpu_memory):
            raise ConfigError(f"--device {spec}: torch sees {len(gpu_memory)} GPU(s), cuda:0 to "
                              f"cuda:{len(gpu_memory) - 1}")  # fmt: skip
        if weights > gpu_memory[spec.index]:
            raise ConfigError(f"--device {spec}: {size} do not fit its {gpu_memory[spec.index] / GIB:.0f} GiB; "
                              "--device cuda spreads them across every visible GPU")  # fmt: skip
        return Placement(f"cuda:{spec.index}", gpus=1)
    if weights <= FIT * gpu_memory[0]:
        return Placement("cuda:0", gpus=1)
    if len(gpu_memory) == 1:
        if weights > gpu_memory[0]:
            raise ConfigError(f"--device {spec}: {size} do not fit the one GPU torch sees "
                              f"({gpu_memory[0] / GIB:.0f} GiB); try --dtype bfloat16, or more GPUs")  # fmt: skip
        return Placement("cuda:0", gpus=1)
    if weights > sum(gpu_memory):
        raise ConfigError(f"--device {spec}: {size} do not fit the {len(gpu_memory)} GPUs torch sees together "
                          f"({sum(gpu_memory) / GIB:.0f} GiB); try --dtype bfloat16")  # fmt: skip
    if not accelerate:
        raise ConfigError(f"--device {spec}: {size} need more than one GPU (cuda:0 has {gpu_memory[0] / GIB:.0f} "
                          f"GiB), and spreading them across the {len(gpu_memory)} GPUs needs accelerate: pip install "
                          "accelerate")  # fmt: skip
    return Placement("cuda:0", device_map="auto", gpus=len(gpu_memory))
