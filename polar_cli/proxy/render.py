"""Chat-template rendering with a local HF tokenizer (scripted backend, retokenizing openai backend).

Prompt ids are the template's rendering of the messages with the generation prompt; a turn's response ids are what
the template renders for the assistant message after that generation prompt, through the end-of-turn token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from polar_cli.errors import BackendError, ConfigError
from polar_cli.proxy.budget import too_long

DEMO_TOKENIZER_ENV = "POLAR_DEMO_TOKENIZER_DIR"
INLINE_RENDER_CHARS = 32 * 1024
"""Prompts with less text than this are rendered on the event loop (well under a millisecond); bigger ones in a
worker thread: a 6 MB message takes seconds to render and tokenize, and must not stall every other session."""
COUNT_CHUNK_CHARS = 64 * 1024
"""A text longer than its token limit is counted in chunks of this many characters before it is encoded whole: the
tokenizer's cost (about 200 bytes per token) is then that of the limit, never of the text."""
CHUNK_SLACK_TOKENS = 8
"""How many more tokens a cut between chunks may count than the whole text has (a token or a special token split)."""

T = TypeVar("T")


def demo_tokenizer_dir() -> Path:
    """Where the demo tokenizer is built once (``$POLAR_DEMO_TOKENIZER_DIR`` or ~/.cache/polar/demo-tokenizer)."""
    override = os.environ.get(DEMO_TOKENIZER_ENV)
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "polar" / "demo-tokenizer"


def _ensure_demo_tokenizer() -> Path:
    out = demo_tokenizer_dir()
    if not (out / "tokenizer_config.json").exists():
        try:
            from polar_cli.demo_model import build_demo_tokenizer
        except ImportError as exc:  # the demo model module ships with the package; this guards a broken install
            raise ConfigError("no --tokenizer given and polar_cli.demo_model is unavailable") from exc
        build_demo_tokenizer(out)
    return out


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str | None = None) -> Any:
    """An HF tokenizer from a directory or hub id (None: the demo tokenizer, built on first use)."""
    from polar_cli.hf import transformers

    source = str(_ensure_demo_tokenizer()) if name_or_path is None else name_or_path
    try:
        return transformers().AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load tokenizer {source!r}: {exc}") from exc


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call arguments as dicts (vLLM does the same)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = dict(message)
            fixed = []
            for call in calls:
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    with contextlib.suppress(orjson.JSONDecodeError):  # a template may still render a raw string
                        fn["arguments"] = orjson.loads(args) if args.strip() else {}
                fixed.append({**call, "function": fn})
            message["tool_calls"] = fixed
        out.append(message)
    return out


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: inline when ``size`` (see :func:`polar_cli.proxy.budget.text_chars`) is small, else in a worker
    thread."""
    if size < INLINE_RENDER_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


class ChatRenderer:
    """Renders prompts and assistant turns to token ids with one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None) -> None:
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        self.end_of_turn: str | None = end_of_turn or ("<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                template_messages(messages), tools=tools or None, add_generation_prompt=gen, tokenize=False
            )
        except Exception as exc:  # jinja errors of any kind: the template rejected these messages
            raise BackendError(f"chat template failed: {type(exc).__name__}: {exc}", status=400) from exc
        return str(text)

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """``text``'s ids; with a ``limit``, a PromptTooLongError once it is clearly past it, before the whole text
        is encoded (a text longer than ``limit`` characters and than one chunk is counted chunk by chunk first), or
        when its ids are."""
        if limit is not None and len(text) > max(limit, COUNT_CHUNK_CHARS):
            counted = 0
            for cuts, start in enumerate(range(0, len(text), COUNT_CHUNK_CHARS)):
                counted += len(self.tokenizer.encode(text[start : start + COUNT_CHUNK_CHARS], add_special_tokens=False))
                if counted > limit + cuts * CHUNK_SLACK_TOKENS:
                    raise too_long(f"more than {limit} tokens in the first {min(start + COUNT_CHUNK_CHARS, len(text))} "
                                   f"of its {len(text)} characters", limit)  # fmt: skip
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if limit is not None and len(ids) > limit:
            raise too_long(f"{len(ids)} tokens", limit)
        return ids

    def prompt_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return self._render(messages, tools, True)

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, limit: int | None = None
    ) -> list[int]:
        """The prompt's ids (``limit``: the most it may have, see :meth:`encode`)."""
        return self.encode(self.prompt_text(messages, tools), limit)

    def conversation_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        limit: int | None = None,
    ) -> list[int]:
        return self.encode(self._render(messages, tools, add_generation_prompt), limit)

    def turn_text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, assistant: dict[str, Any]
    ) -> str:
        """The template's text for ``assistant`` after the generation prompt, through the end-of-turn token."""
        prompt = self.prompt_text(messages, tools)
        full = self._render([*messages, assistant], tools, False)
        if not full.startswith(prompt):
            raise BackendError(
                "the chat template does not render the assistant turn as an extension of the generation prompt",
                status=500,
            )
        turn = full[len(prompt) :]
        if self.end_of_turn and self.end_of_turn in turn:
            turn = turn[: turn.index(self.end_of_turn) + len(self.end_of_turn)]
        return turn

    def turn_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, assistant: dict[str, Any]
    ) -> list[int]:
        return self.encode(self.turn_text(messages, tools, assistant))

    def tokens(self, ids: list[int]) -> list[str]:
        return [str(t) for t in self.tokenizer.convert_ids_to_tokens(ids)]
