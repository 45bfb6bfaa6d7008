"""The one place Polar imports HuggingFace ``transformers`` (tokenizers, chat templates and generation configs only)."""

from __future__ import annotations

import os
from types import ModuleType


def transformers() -> ModuleType:
    """``transformers``, imported without its advisory that PyTorch is missing: Polar never needs a model from it."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers as module

    return module
