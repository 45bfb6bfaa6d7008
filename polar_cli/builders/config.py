"""The built-in builders' own configuration (``BuilderSpec.config``): strict, so a typo is an error at submit.

Session facts (ids, harness, task metadata, status) are not configuration: they come in the builder's
:class:`~polar_cli.interfaces.builder.BuildContext`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from polar_cli.models import StrictModel

MergeRule = Literal["exact", "prompt_prefix"]
"""When ``prefix_merging`` lets a completion continue a chain (docs/builders.md, "prefix_merging")."""


class BuilderConfig(StrictModel):
    """What every built-in builder accepts (``BuilderSpec.config`` or ``build_trajectory`` keyword arguments)."""

    eos_token_id: int | list[int] | None = Field(default=None, description="end-of-turn token id(s)")
    tokenizer: Any = Field(default=None, description="HF tokenizer directory, hub id, or a loaded tokenizer")
    allow_retokenized: bool = Field(default=False, description="accept locally re-tokenized completions")
    verify: bool = Field(default=False, description="run polar_cli.builders.verify and raise on a violation")
    merge: MergeRule = Field(
        default="exact",
        description="prefix_merging's join rule: exact (the next prompt must start with the previous prompt and "
        "the ids it sampled, so every trace is the context its tokens were sampled in) or prompt_prefix (the paper's "
        "rule: the previous prompt alone must be a prefix; traces record context_exact where that differs)",
    )

    @field_validator("eos_token_id")
    @classmethod
    def _non_empty(cls, value: int | list[int] | None) -> int | list[int] | None:
        if isinstance(value, list) and not value:
            raise ValueError("eos_token_id list is empty")
        return value
