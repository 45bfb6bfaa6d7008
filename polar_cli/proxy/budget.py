"""The prompt budget: how much prompt one request may make the proxy parse, tokenize or render.

The proxy tokenizes and renders some prompts itself (``count_tokens``/``countTokens``, token mode's prompt, the
scripted and retokenizing backends). Unbounded, one body of 4 MB of newlines took a proxy from 79 MB to 764 MB. Each
request now has a budget of prompt tokens: ``max_prompt_tokens`` when configured, else the model's context length as
the inference server reports it (vLLM's ``max_model_len``), else :data:`DEFAULT_PROMPT_TOKENS`. It is checked three
times, cheapest first, each before the next cost is paid:

1. the body's bytes, before it is parsed: a body larger than the budget's characters (:attr:`PromptBudget.max_chars`,
   ``CHARS_PER_TOKEN`` per token) may hold at most ``max_chars / 4`` JSON values (commas and brackets, counted at
   memchr speed), so parsing it costs about its own size, never twenty times it;
2. the prompt's text, once decoded: more characters (every string of the messages and tools a template renders; an
   image counts 64) than ``max_chars`` is refused without tokenizing anything;
3. the tokenization itself (:func:`polar_cli.proxy.render.ChatRenderer.encode`): the rendered text is counted in
   chunks, and stopped once past the budget, so its cost is the budget's, never the body's.

Each refusal is a :class:`~polar_cli.errors.PromptTooLongError`: a 400 in the provider's shape naming the budget, its
message saying "prompt is too long" and "context length" as the providers' own refusals do (the Responses codec
answers it with the code ``context_length_exceeded``, which Codex does not retry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from polar_cli.errors import PromptTooLongError

DEFAULT_PROMPT_TOKENS = 131072
"""The budget when neither ``max_prompt_tokens`` nor the inference server says the model's context length."""
CHARS_PER_TOKEN = 8
"""Characters of text per budgeted token before any tokenizing (English averages about 4 per token)."""
VALUES_PER_CHAR = 4
"""A body over the budget's characters may hold one JSON value per this many of them."""
IMAGE_CHARS = 64
"""What a non-text content part (an image) counts as in :func:`text_chars`: its data is never rendered as text."""

BudgetSource = Literal["config", "model", "default"]
_WHY: dict[BudgetSource, str] = {
    "config": "max_prompt_tokens",
    "model": "the model's context length",
    "default": "the default; set max_prompt_tokens",
}


def too_long(what: str, tokens: int, source: BudgetSource | None = None) -> PromptTooLongError:
    """The refusal of a prompt over a budget of ``tokens``: ``what`` says what was found."""
    why = f" ({_WHY[source]})" if source is not None else ""
    return PromptTooLongError(f"prompt is too long for the context length: {what}, over this proxy's budget of "
                              f"{tokens} prompt tokens{why}")  # fmt: skip


def _chars(value: Any) -> int:
    """Characters of every string (keys too) in a JSON value; other scalars count one."""
    total, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node)
        elif isinstance(node, dict):
            for key, child in node.items():
                total += len(key) if isinstance(key, str) else 1
                stack.append(child)
        elif isinstance(node, list):
            stack.extend(node)
        else:
            total += 1
    return total


def text_chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """How much text a chat template may render of a prompt: every string of the messages and tools, except that a
    content part other than text (an image) counts :data:`IMAGE_CHARS`. An upper bound of what is tokenized, and
    enough to tell a prompt that renders in microseconds from one that takes seconds."""
    total = _chars(tools) if tools else 0
    for message in messages:
        for key, value in message.items():
            total += len(key)
            if key == "content" and isinstance(value, list):
                for part in value:
                    text = part.get("text") if isinstance(part, dict) else None
                    total += len(text) if isinstance(text, str) else IMAGE_CHARS
            else:
                total += _chars(value)
    return total


@dataclass(frozen=True, slots=True)
class PromptBudget:
    """A budget of prompt tokens and where it came from."""

    tokens: int
    source: BudgetSource = "default"

    @property
    def max_chars(self) -> int:
        """Characters of prompt text (and bytes of body before the JSON-value check) the budget allows."""
        return self.tokens * CHARS_PER_TOKEN

    def refuse(self, what: str) -> PromptTooLongError:
        return too_long(what, self.tokens, self.source)

    def check_body(self, raw: bytes) -> None:
        """Before parsing: a body over :attr:`max_chars` bytes holds at most ``max_chars / VALUES_PER_CHAR`` JSON
        values (what a parse costs is about 70 bytes per value, plus the strings)."""
        if len(raw) <= self.max_chars:
            return
        values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
        limit = self.max_chars // VALUES_PER_CHAR
        if values > limit:
            raise self.refuse(f"a body of {len(raw)} bytes with up to {values} JSON values (at most {limit})")

    def check_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, body_bytes: int) -> None:
        """Before tokenizing: the prompt's text within :attr:`max_chars`. A body of at most half of them cannot hold
        more (a decoded string is never longer than its JSON), so only bigger bodies pay for the walk."""
        if body_bytes <= self.max_chars // 2:
            return
        chars = text_chars(messages, tools)
        if chars > self.max_chars:
            raise self.refuse(f"{chars} characters of text (at most {self.max_chars}, {CHARS_PER_TOKEN} per token)")
