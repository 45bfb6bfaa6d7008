"""The one part that needs torch and transformers (the ``train`` extra, imported only here, only when called): a
causal LM's logprob of chosen tokens of a sequence, the sequence run through the model once."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar_cli.errors import ConfigError
from polar_cli.extras import require

DTYPES = ("float32", "float64", "bfloat16", "float16")
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


class CausalLM:
    """A model folder loaded for scoring, on the CPU, in ``dtype``; logprobs come from a float32 (float64 when
    ``dtype`` is) ``log_softmax`` of its logits, without temperature."""

    def __init__(self, path: Path, dtype: str = "float32") -> None:
        if dtype not in DTYPES:
            raise ConfigError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
        self.torch: Any = require("torch", needed_by=NEEDED_BY, extra="train")
        transformers = require("transformers", needed_by=NEEDED_BY, extra="train")
        check_model_dir(path)
        self.path = path
        self.dtype = getattr(self.torch, dtype)
        self.score_dtype = self.torch.float64 if dtype == "float64" else self.torch.float32
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=self.dtype)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--model {path}: transformers cannot load it: {exc}") from exc
        self.model = model.eval()
        self._keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)

    def logprobs(self, ids: Sequence[int], positions: Sequence[int]) -> list[float]:
        """The logprob of ``ids[p]`` for each ``p`` of ``positions`` (each >= 1), from the logits at ``p - 1``."""
        torch = self.torch
        if not positions:
            return []
        with torch.inference_mode():
            input_ids = torch.tensor([list(ids)], dtype=torch.long)
            before = torch.tensor([p - 1 for p in positions], dtype=torch.long)
            if self._keep:  # only the rows needed: a long sequence's full logits would not fit in memory
                logits = self.model(input_ids=input_ids, logits_to_keep=before).logits[0]
            else:
                logits = self.model(input_ids=input_ids).logits[0, before]
            scores = torch.log_softmax(logits.to(self.score_dtype), dim=-1)
            chosen = torch.tensor([ids[p] for p in positions], dtype=torch.long)
            return [float(x) for x in scores.gather(1, chosen[:, None])[:, 0].tolist()]
