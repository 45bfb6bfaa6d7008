"""The proxy's internal currency: a normalized chat request in, a generation with token ids out.

Every provider codec decodes its wire request into a :class:`ChatRequest` (OpenAI Chat Completions semantics) and
encodes a :class:`Generation` back into its own wire shape. Backends only ever see ChatRequest and return Generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar_cli.models import TokenSource

# Sampling/decoding parameters a ChatRequest may carry (OpenAI chat names). Anything else is dropped by codecs.
SAMPLING_PARAMS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "response_format",
    "parallel_tool_calls",
)


@dataclass
class ChatRequest:
    """A provider request normalized to OpenAI Chat Completions.

    ``messages`` are OpenAI chat messages with exactly one leading ``system`` message at most (codecs merge
    system/developer text into it). Assistant messages may carry ``tool_calls`` (arguments as JSON strings) and
    ``reasoning_content``. ``tools`` are OpenAI function tools. ``context`` holds what a codec needs to answer in its
    own shape (e.g. which tool names were Responses ``custom`` tools); backends ignore it.
    """

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    context: dict[str, Any] = field(default_factory=dict)

    def openai_body(self) -> dict[str, Any]:
        """The non-streaming OpenAI chat body (without backend-specific token switches)."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages}
        if self.tools:
            body["tools"] = self.tools
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        body.update({k: v for k, v in self.params.items() if v is not None})
        body["stream"] = False
        return body


@dataclass
class Generation:
    """One backend answer with the token-level data training needs.

    ``message`` is an OpenAI assistant message: ``{"role": "assistant", "content": str | None,
    "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": str}}] | absent,
    "reasoning_content": str | absent}``. ``finish_reason`` uses OpenAI values (stop, length, tool_calls,
    content_filter). ``response_ids`` are every sampled token id (including the end-of-turn token and any text a
    parser hid), ``response_logprobs`` one float per id.
    """

    id: str
    model: str
    message: dict[str, Any]
    finish_reason: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None = None
    response_tokens: list[str] | None = None
    token_source: TokenSource = "backend"
    backend: str | None = None
    backend_seconds: float | None = None
    created: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.response_ids)

    @property
    def text(self) -> str:
        content = self.message.get("content")
        return content if isinstance(content, str) else ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])

    @property
    def reasoning(self) -> str | None:
        value = self.message.get("reasoning_content") or self.message.get("reasoning")
        return value if isinstance(value, str) and value else None
