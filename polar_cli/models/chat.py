"""What passes between the proxy and an inference backend: a normalized chat request in, a generation with token
ids out (and, for pass-through streaming, an :class:`UpstreamStream` of chunks).

Every provider codec in ``polar_cli.proxy`` decodes its wire request into a :class:`ChatRequest` (OpenAI Chat
Completions semantics) and encodes a :class:`Generation` back into its own wire shape. Backends
(``polar_cli.interfaces.BackendClient``) only ever see ChatRequest and return Generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

import orjson

from polar_cli.models import PromptSpan, TokenSource
from polar_cli.models.inference import LogprobsMode, VersionSpan

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


INTERRUPTED = "interrupted"
"""``finish_reason`` of a token-mode Generation the pool stopped (an abort-mode pause) to resume it later: never
recorded, never seen by a harness."""


@dataclass
class SampledSoFar:
    """The ids (and their logprobs and texts) a call sampled before it was interrupted."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[tuple[int, int]] = field(default_factory=list)
    """``(first token index, policy version)`` per stretch, in order."""


@dataclass
class TokenPrompt:
    """A prompt the proxy built as ids (token mode, :mod:`polar_cli.proxy.token_prompt`): what the backend sends to
    its token-in route instead of the messages, and how it was made."""

    ids: list[int]
    spans: list[PromptSpan]
    base: str | None = None
    """The recorded completion whose prompt and sampled ids it starts with (None: wholly rendered)."""
    edited: bool = False
    """The harness echoed the base's answer back changed; the model still sees it as sampled."""
    reasoning_dropped: bool = False
    """``keep_reasoning: false``: the base's answer held reasoning, so nothing was spliced (the template dropped it)."""
    upstream: dict[str, Any] | None = None
    """What the backend's render call returned beside the ids (vLLM: the ready generate request, sampling included)."""
    rendered_len: int = 0
    """How many ids the template's rendering of the whole conversation had."""
    sampled: SampledSoFar | None = None
    """A resumed call (partial rollouts): what was sampled before the interruption; the backend continues from
    ``ids + sampled.ids`` and answers the whole reply."""
    interrupt: asyncio.Event | None = None
    """Set by the inference pool to stop the call where it is (an abort-mode pause): the backend then answers what
    it has sampled so far with ``finish_reason == INTERRUPTED``."""

    def record(self) -> dict[str, Any]:
        """Its journal summary (``Completion.metadata.token_prompt``)."""
        return {"base": self.base, "edited": self.edited, "reasoning_dropped": self.reasoning_dropped,
                "rendered_tokens": self.rendered_len}  # fmt: skip


@dataclass
class Rendered:
    """A backend's rendering of a chat request as prompt ids (its template, its generation prompt)."""

    ids: list[int]
    upstream: dict[str, Any] | None = None


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
    token_prompt: TokenPrompt | None = None
    """Token mode: the prompt as ids; a backend sends these, never the messages (one without a token-in route
    refuses the call)."""
    prompt_budget: int | None = None
    """The most prompt tokens the proxy may tokenize or render for this request (:mod:`polar_cli.proxy.budget`): a
    backend that tokenizes locally stops there with a PromptTooLongError. None: unbounded."""

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


class JsonTokenIds(Sequence[int]):
    """Token ids kept as the JSON array text a server sent (e.g. vLLM's 32K ``prompt_token_ids``).

    Parsing tens of thousands of ints costs about a millisecond per call; the proxy only needs their count on the hot
    path and writes the text verbatim into the journal (``orjson.Fragment``). The values are parsed on first use.
    """

    __slots__ = ("_list", "checked", "commas", "length", "raw")

    def __init__(self, raw: bytes, length: int = -1) -> None:
        self.raw = raw
        self.length = length
        # polar_cli.proxy.token_json's scan: the commas of a plain ``[1,2,3]`` text (-1: not that shape) and the
        # verdict of json_ids_ok, once each has looked
        self.commas: int | None = None
        self.checked: bool | None = None
        self._list: list[int] | None = None

    def count_commas(self) -> int:
        """The number of ids, from the text (ids are plain ints, so commas + 1 unless empty)."""
        return self.raw.count(b",") + 1 if self.raw.strip(b"[] \t\r\n") else 0

    def tolist(self) -> list[int]:
        if self._list is None:
            self._list = [int(i) for i in orjson.loads(self.raw)]
        return self._list

    def __len__(self) -> int:
        if self.length < 0:  # unknown until asked
            self.length = self.count_commas()
        return self.length

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self.tolist()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JsonTokenIds):
            other = other.tolist()
        return isinstance(other, list | tuple) and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JsonTokenIds({len(self)} ids)"


StreamMode = Literal["passthrough", "synthetic"]
"""How a streamed answer reaches the client (``ProxyConfig.stream_mode``, journaled as ``metadata.stream_mode``):
re-encoded chunk by chunk as the backend samples it, or replayed whole once the backend has answered."""


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
    prompt_ids: list[int] | JsonTokenIds
    response_ids: list[int]
    response_logprobs: list[float] | None = None
    response_tokens: list[str] | None = None
    token_source: TokenSource = "backend"
    backend: str | None = None
    backend_seconds: float | None = None
    created: int = 0
    policy_version: int | None = None
    """The policy version the call was sampled under (set by the inference pool; the first span's when it crossed an
    update)."""
    version_spans: list[VersionSpan] | None = None
    """Set only when the call crossed a weight update: which response tokens were sampled under which version."""
    replica: str | None = None
    """The inference server that answered (its URL)."""
    logprobs_mode: LogprobsMode | None = None

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


@dataclass
class StreamStart:
    """What an upstream stream says before any content: the answer's id, creation time and model."""

    id: str
    created: int
    model: str
    prompt_tokens: int = 0


@dataclass
class StreamDelta:
    """One piece of an answer as it streams: reasoning text, content text and/or tool-call fragments.

    ``tool_calls`` are OpenAI stream fragments ``{"index", "id"?, "function": {"name"?, "arguments"?}}``: the first
    fragment of a call carries its id and name. ``logprobs`` are the OpenAI ``logprobs.content`` entries of the tokens
    this piece came from (empty when the client did not ask or a parser held the text back).
    """

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls or self.logprobs)

    @classmethod
    def pieces_of(cls, generation: Generation) -> list[StreamDelta]:
        """A whole generation as pieces, in answer order: reasoning, text, then one piece per tool call."""
        pieces = []
        if generation.reasoning:
            pieces.append(cls(reasoning=generation.reasoning))
        if generation.text:
            pieces.append(cls(content=generation.text))
        for index, call in enumerate(generation.tool_calls):
            fn = call.get("function") or {}
            function = {"name": fn.get("name"), "arguments": fn.get("arguments") or ""}
            fragment = {"index": index, "id": call.get("id"), "function": function}
            pieces.append(cls(tool_calls=[fragment]))
        return pieces


class UpstreamStream(Protocol):
    """An open upstream stream: its chunks in order, and a way to stop it."""

    def chunks(self) -> AsyncIterator[dict[str, Any]]: ...

    def abort(self) -> None: ...
