"""Builder configuration and the end-of-turn token ids that prefix merging needs.

The end-of-turn ids always come from configuration (``eos_token_id``) or from the model's tokenizer directory
(``generation_config.json``, else the tokenizer's ``eos_token``), never from looking at sampled tokens: one truncated
or odd sample would otherwise decide where every interstitial segment starts.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from polar_cli.errors import BuildError, ConfigError
from polar_cli.models import StrictModel, TrajectoryStatus
from polar_cli.models.base import describe_validation_error

HOW_TO_PASS_EOS = (
    "pass eos_token_id=<id or list of ids> or tokenizer=<HF tokenizer directory> in the builder config "
    "(a task's builder: {strategy: prefix_merging, config: {tokenizer: /path/to/model}}, "
    "or build_trajectory('prefix_merging', completions, eos_token_id=151645))"
)


class BuilderConfig(StrictModel):
    """What every built-in builder accepts (``BuilderSpec.config`` or ``build_trajectory`` keyword arguments)."""

    eos_token_id: int | list[int] | None = Field(default=None, description="end-of-turn token id(s)")
    tokenizer: Any = Field(default=None, description="HF tokenizer directory, hub id, or a loaded tokenizer")
    session_id: str | None = None
    task_id: str | None = None
    harness: str | None = None
    task_metadata: dict[str, Any] = Field(default_factory=dict, description="group_id, policy_version, ...")
    status: TrajectoryStatus = "completed"
    allow_retokenized: bool = Field(default=False, description="accept locally re-tokenized completions")
    verify: bool = Field(default=False, description="run polar_cli.builders.verify and raise on a violation")

    @field_validator("eos_token_id")
    @classmethod
    def _non_empty(cls, value: int | list[int] | None) -> int | list[int] | None:
        if isinstance(value, list) and not value:
            raise ValueError("eos_token_id list is empty")
        return value


def parse_config(builder: str, config: dict[str, Any]) -> BuilderConfig:
    """Validate builder keyword arguments; unknown or ill-typed ones become a ConfigError naming the field."""
    try:
        return BuilderConfig.model_validate(config)
    except ValidationError as exc:
        raise ConfigError(f"builder {builder!r}: {describe_validation_error(exc, BuilderConfig)}") from exc


def end_of_turn_ids(config: BuilderConfig, builder: str) -> frozenset[int]:
    """The configured end-of-turn ids; a BuildError saying how to pass them when neither source is given."""
    if config.eos_token_id is not None:
        raw = config.eos_token_id
        return frozenset(raw if isinstance(raw, list) else [raw])
    if config.tokenizer is not None:
        return _from_tokenizer(config.tokenizer, builder)
    raise BuildError(f"builder {builder!r} needs the model's end-of-turn token id: {HOW_TO_PASS_EOS}")


def _as_ids(value: Any) -> frozenset[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return frozenset([value])
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return frozenset(value)
    return None


def _from_tokenizer(tokenizer: Any, builder: str) -> frozenset[int]:
    if isinstance(tokenizer, str | os.PathLike):
        return _from_tokenizer_path(os.fspath(tokenizer), builder)
    # A loaded tokenizer: prefer its directory's generation config, which lists every stop id (e.g. Qwen's two).
    source = getattr(tokenizer, "name_or_path", None)
    if isinstance(source, str) and source:
        ids = _generation_config_ids(Path(source).expanduser())
        if ids:
            return ids
    ids = _as_ids(getattr(tokenizer, "eos_token_id", None))
    if ids is None:
        raise BuildError(f"builder {builder!r}: tokenizer {tokenizer!r} has no eos_token_id; {HOW_TO_PASS_EOS}")
    return ids


def _generation_config_ids(directory: Path) -> frozenset[int] | None:
    path = directory / "generation_config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _as_ids(data.get("eos_token_id")) if isinstance(data, dict) else None


@functools.lru_cache(maxsize=64)
def _from_tokenizer_path(source: str, builder: str) -> frozenset[int]:
    directory = Path(source).expanduser()
    ids = _generation_config_ids(directory) if directory.is_dir() else None
    if ids:
        return ids
    try:
        from polar_cli.hf import transformers

        hf = transformers()

        if not directory.is_dir():
            try:
                ids = _as_ids(hf.GenerationConfig.from_pretrained(source).eos_token_id)
            except (OSError, ValueError):
                ids = None
            if ids:
                return ids
        loaded = hf.AutoTokenizer.from_pretrained(str(directory) if directory.is_dir() else source)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())  # one line: the CLI prints errors as one line
        raise BuildError(f"builder {builder!r}: cannot load tokenizer {source!r}: {reason}; {HOW_TO_PASS_EOS}") from exc
    ids = _as_ids(getattr(loaded, "eos_token_id", None))
    if ids is None:
        raise BuildError(f"builder {builder!r}: tokenizer {source!r} defines no eos token; {HOW_TO_PASS_EOS}")
    return ids
