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

DEMO_TOKENIZER_ENV = "POLAR_DEMO_TOKENIZER_DIR"
INLINE_RENDER_CHARS = 32 * 1024
"""Prompts with less text than this are rendered on the event loop (well under a millisecond); bigger ones in a
worker thread: a 6 MB message takes seconds to render and tokenize, and must not stall every other session."""

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


def text_chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """About how much text a prompt holds (message contents, text parts, tool-call arguments, tool count): cheap,
    and enough to tell a prompt that renders in microseconds from one that takes seconds."""
    total = len(tools or ()) * 256
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                total += len(text) if isinstance(text, str) else 64
        for key in ("reasoning_content", "reasoning"):
            extra = message.get(key)
            total += len(extra) if isinstance(extra, str) else 0
        for call in message.get("tool_calls") or ():
            args = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            total += len(args) if isinstance(args, str) else 64
    return total


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: inline when ``size`` (see :func:`text_chars`) is small, else in a worker thread."""
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

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return self._render(messages, tools, True)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self.prompt_text(messages, tools))

    def conversation_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> list[int]:
        return self.encode(self._render(messages, tools, add_generation_prompt))

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
