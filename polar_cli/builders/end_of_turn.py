"""The end-of-turn token ids prefix merging needs, and where they came from.

In order, the first source that gives them wins:

1. the builder config's ``eos_token_id``;
2. the builder config's ``tokenizer`` (its directory's ``generation_config.json``, else the tokenizer's ``eos_token``);
3. the served model's tokenizer as the gateway knows it (``BuildContext.tokenizer``: the proxy's ``--tokenizer``, the
   inference server's model, or the scripted backend's demo tokenizer);
4. the recorded completions: every completion that ended on its own (finish reason ``stop`` or ``tool_calls``) ends
   with the end-of-turn token (vLLM and SGLang return it among the sampled ids), so when they all end with the same
   id, that id is it. Truncated completions (``length``) say nothing and are left out; completions that disagree
   (a stop string, an odd sample) are an error, never a vote.

A configured source that fails is an error; a tokenizer the gateway found itself that cannot be loaded gives way to
the completions. The source is recorded in the trajectory's and every trace's metadata (``end_of_turn_source``).
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_cli.builders.config import BuilderConfig
from polar_cli.errors import BuildError
from polar_cli.interfaces.builder import BuildContext
from polar_cli.models import Completion

HOW_TO_PASS_EOS = (
    "pass eos_token_id=<id or list of ids> or tokenizer=<HF tokenizer directory> in the builder config "
    "(a task's builder: {strategy: prefix_merging, config: {tokenizer: /path/to/model}}, "
    "or build_trajectory('prefix_merging', completions, eos_token_id=151645))"
)
SELF_STOPPED = ("stop", "tool_calls")
"""Finish reasons of a completion that ended by sampling its end-of-turn token."""


@dataclass(frozen=True)
class EndOfTurn:
    """The end-of-turn ids and their source: ``eos_token_id``, ``tokenizer``, ``<proxy|server|demo>_tokenizer`` or
    ``completions``."""

    ids: frozenset[int]
    source: str


def end_of_turn(
    config: BuilderConfig,
    builder: str,
    *,
    context: BuildContext | None = None,
    completions: Sequence[Completion] = (),
) -> EndOfTurn:
    """The end-of-turn ids for one session (see the module docstring for the order); BuildError when none is found."""
    if config.eos_token_id is not None:
        raw = config.eos_token_id
        return EndOfTurn(frozenset(raw if isinstance(raw, list) else [raw]), "eos_token_id")
    if config.tokenizer is not None:
        return EndOfTurn(_from_tokenizer(config.tokenizer, builder), "tokenizer")
    context = context or BuildContext()
    tokenizer_problem = ""
    if context.tokenizer is not None:
        try:
            ids = _from_tokenizer(context.tokenizer, builder)
        except BuildError as exc:
            tokenizer_problem = f"{exc}; "
        else:
            return EndOfTurn(ids, f"{context.tokenizer_source or 'gateway'}_tokenizer")
    try:
        return EndOfTurn(from_completions(completions, builder), "completions")
    except BuildError as exc:
        raise BuildError(f"{tokenizer_problem}{exc}") from None


def from_completions(completions: Sequence[Completion], builder: str) -> frozenset[int]:
    """The one id every self-stopped completion ends with (see the module docstring); BuildError otherwise."""
    last = Counter(c.response_ids[-1] for c in completions if c.finish_reason in SELF_STOPPED and c.response_ids)
    if len(last) == 1:
        return frozenset(last)
    if not last:
        why = "no recorded completion ended with finish reason stop or tool_calls to read it from"
    else:
        seen = ", ".join(f"{token} ({count}x)" for token, count in last.most_common())
        why = f"the completions that ended on their own end with different tokens: {seen}"
    raise BuildError(f"builder {builder!r} needs the model's end-of-turn token id: {why}; {HOW_TO_PASS_EOS}")


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
