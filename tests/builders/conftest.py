"""Real HF tokenizers with ChatML templates, built offline once per test session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class TokenizerCase:
    name: str
    path: Path
    tokenizer: Any

    @property
    def eot(self) -> int:
        return int(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))


def _load(name: str, path: Path) -> TokenizerCase:
    from transformers import AutoTokenizer

    return TokenizerCase(name, path, AutoTokenizer.from_pretrained(str(path)))


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TokenizerCase:
    from polar_cli.demo_model import build_demo_tokenizer

    return _load("demo", build_demo_tokenizer(tmp_path_factory.mktemp("demo-tokenizer")))


@pytest.fixture(scope="session")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TokenizerCase:
    from tests.builders.qwen_tokenizer import build_qwen_tokenizer, qwen_tiktoken_path

    if qwen_tiktoken_path() is None:
        pytest.skip("the Qwen vocabulary comes from dashscope's qwen.tiktoken: pip install -e '.[dev]'")

    return _load("qwen", build_qwen_tokenizer(tmp_path_factory.mktemp("qwen-tokenizer")))


@pytest.fixture(scope="session", params=["demo", "qwen"])
def any_tokenizer(request: pytest.FixtureRequest) -> TokenizerCase:
    case: TokenizerCase = request.getfixturevalue(f"{request.param}_tokenizer")
    return case
