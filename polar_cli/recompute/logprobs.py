"""The one part that needs torch and transformers (the ``train`` extra, imported only here, only when called): a
causal LM's logprob of chosen tokens of a sequence.

The sequence goes through the model in chunks of ``chunk_size`` tokens, each attending to the ones before it through
the KV cache (chunked prefill): attention never materializes more than ``chunk_size`` rows of scores per head, and
the logits are only those of the scored positions of one chunk at a time, each chunk's turned into the tokens'
logprobs (``log_softmax``, gather) before the next runs. A sequence up to ``chunk_size`` tokens long goes through in
one pass; ``chunk_size`` 0 sends every sequence in one pass."""

from __future__ import annotations

import bisect
import importlib.util
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar_cli.errors import ConfigError
from polar_cli.extras import require
from polar_cli.recompute.placement import Placement, model_bytes, parse_device, place

DTYPES = ("float32", "float64", "bfloat16", "float16")
TOLERANCES = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 5e-2, "float16": 1e-2}
"""The default ``--tolerance`` (most mean |Δlogprob| of a trace) per ``--dtype``: docs/verify.md#dtypes measures
each dtype's own error against float32."""
CHUNK_SIZE = 2048
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")
NEEDED_BY = "polar verify --recompute"


def check_model_dir(path: Path) -> None:
    """ConfigError unless ``path`` is a folder with a ``config.json`` and weights (what ``from_pretrained`` loads)."""
    if not path.is_dir():
        raise ConfigError(f"--model {path}: no such folder")
    if not (path / "config.json").is_file():
        raise ConfigError(f"--model {path}: no config.json there (not a transformers model folder)")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ConfigError(f"--model {path}: no weights there (*.safetensors or pytorch_model*.bin)")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")


def gpu_memory(torch: Any) -> list[int]:
    """The total memory of each GPU torch sees (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [int(torch.cuda.get_device_properties(i).total_memory) for i in range(torch.cuda.device_count())]


def placement(path: Path, dtype: str, device: str) -> Placement:
    """Where ``--device`` puts the model in folder ``path`` loaded in ``dtype`` (ConfigError when it cannot go
    there: see polar_cli.recompute.placement)."""
    torch = require("torch", needed_by=NEEDED_BY, extra="train")
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    accelerate = importlib.util.find_spec("accelerate") is not None
    return place(parse_device(device), gpu_memory(torch), model_bytes(path, itemsize), accelerate=accelerate,
                 dtype=dtype)  # fmt: skip


class CausalLM:
    """A model folder loaded for scoring, in ``dtype``, where ``device`` places it; logprobs come from a float32
    (float64 when ``dtype`` is) ``log_softmax`` of its logits, without temperature, ``chunk_size`` tokens a pass."""

    def __init__(self, path: Path, dtype: str = "float32", device: str = "auto", chunk_size: int = CHUNK_SIZE) -> None:
        check_dtype(dtype)
        if chunk_size < 0:
            raise ConfigError(f"--chunk-size {chunk_size}: 0 (one pass) or more tokens")
        self.torch: Any = require("torch", needed_by=NEEDED_BY, extra="train")
        transformers = require("transformers", needed_by=NEEDED_BY, extra="train")
        check_model_dir(path)
        self.path, self.chunk_size = path, chunk_size
        self.placement = placement(path, dtype, device)
        self.dtype = getattr(self.torch, dtype)
        self.score_dtype = self.torch.float64 if dtype == "float64" else self.torch.float32
        options: dict[str, Any] = {"dtype": self.dtype}
        if self.placement.device_map:
            options["device_map"] = self.placement.device_map
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path), **options)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--model {path}: transformers cannot load it: {exc}") from exc
        if not self.placement.device_map:
            model = model.to(self.placement.device)
        self.model = model.eval()
        parameters = inspect.signature(self.model.forward).parameters
        self._keep = "logits_to_keep" in parameters
        self._cache = "cache" if "cache" in parameters else "past_key_values"  # transformers >= 5.24 says cache
        embeddings = self.model.get_input_embeddings()
        self.vocab_size = int(embeddings.num_embeddings)
        self.input_device = embeddings.weight.device

    def logprobs(self, ids: Sequence[int], positions: Sequence[int]) -> list[float]:
        """The logprob of ``ids[p]`` for each ``p`` of ``positions`` (each >= 1), from the logits at ``p - 1``."""
        torch = self.torch
        if not positions:
            return []
        rows = sorted((p - 1, k) for k, p in enumerate(positions))  # (the logits' position, index into positions)
        end = rows[-1][0] + 1  # the tokens after the last logits needed change nothing before them
        step = self.chunk_size or end
        out = [0.0] * len(positions)
        past = None
        with torch.inference_mode():
            input_ids = torch.tensor([list(ids[:end])], dtype=torch.long, device=self.input_device)
            for start in range(0, end, step):
                stop = min(start + step, end)
                chunk = rows[bisect.bisect_left(rows, (start, -1)) : bisect.bisect_left(rows, (stop, -1))]
                before = [row - start for row, _ in chunk]
                logits, past = self._forward(input_ids[:, start:stop], before, past, more=stop < end)
                if not chunk:
                    continue
                scores = torch.log_softmax(logits.to(self.score_dtype), dim=-1)
                del logits
                chosen = torch.tensor([ids[positions[k]] for _, k in chunk], dtype=torch.long, device=scores.device)
                for (_, k), value in zip(chunk, scores.gather(1, chosen[:, None])[:, 0].tolist(), strict=True):
                    out[k] = float(value)
                del scores
        return out

    def _forward(self, input_ids: Any, before: list[int], past: Any, *, more: bool) -> tuple[Any, Any]:
        """One pass over a chunk after the cached ``past``: the logits at the chunk's positions ``before`` (a row of
        the last position stands in when there are none), and the cache when ``more`` chunks follow."""
        torch = self.torch
        options: dict[str, Any] = {"input_ids": input_ids, "use_cache": more or past is not None}
        if past is not None:
            options[self._cache] = past
        index = torch.tensor(before or [input_ids.shape[1] - 1], dtype=torch.long)
        if self._keep:  # only the rows needed: a long chunk's full logits are vocabulary-by-chunk floats
            options["logits_to_keep"] = index
            result = self.model(**options)
            logits = result.logits[0]
        else:
            result = self.model(**options)
            logits = result.logits[0, index.to(result.logits.device)]
        return logits, (getattr(result, self._cache) if more else None)
