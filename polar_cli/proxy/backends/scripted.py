"""The scripted backend: replays a per-session script of assistant turns with real token ids.

A script is a list of OpenAI-style assistant messages. Each generation call of a session takes the session's next
turn, renders the prompt and the turn with a real HF chat template, and answers like vLLM would (prompt ids, response
ids through the end-of-turn token, one deterministic logprob per token). A turn may carry the ids and logprobs to
answer with instead, and what the request must be (``expect``: a replayed session, see :mod:`polar_cli.replay`).
A script may also be a set of variants, one played per sample of a task (cycled, or a seeded draw per sample index).
See docs/scripted-backend.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BeforeValidator, Field, field_validator, model_validator

from polar_cli.config import read_data_file
from polar_cli.errors import BackendError, ConfigError, PromptTooLongError
from polar_cli.interfaces.backend import BackendClient
from polar_cli.models import StrictModel, validate_model
from polar_cli.models.chat import ChatRequest, Generation, Rendered, UpstreamStream
from polar_cli.proxy.backends.script_check import ExpectedRequest, divergence, mask_session
from polar_cli.proxy.budget import text_chars
from polar_cli.proxy.render import ChatRenderer, load_tokenizer, off_loop
from polar_cli.proxy.sessions import INLINE_SCRIPT_RULE

log = logging.getLogger("polar.proxy.scripted")


class ScriptFunction(StrictModel):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ScriptToolCall(StrictModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ScriptFunction


class ScriptError(StrictModel):
    status: int = 500
    message: str = "scripted backend error"


class ScriptTurn(StrictModel):
    """One scripted assistant turn (or a scripted backend failure)."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    reasoning_content: str | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    error: ScriptError | None = None
    response_ids: list[int] | None = Field(default=None, description="answer with these ids instead of rendering")
    logprobs: list[float] | None = Field(default=None, description="their logprobs (default: the deterministic ones)")
    expect: ExpectedRequest | None = Field(default=None, description="what this call's request must be (a replay)")

    @model_validator(mode="after")
    def _aligned(self) -> ScriptTurn:
        if self.logprobs is not None and len(self.logprobs) != len(self.response_ids or []):
            raise ValueError("logprobs needs response_ids of the same length")
        return self


class Script(StrictModel):
    turns: list[ScriptTurn]


class ScriptVariants(StrictModel):
    """Several scripts for one task: each sample plays one, so a task's samples can differ (mixed rewards)."""

    variants: list[list[Any]] = Field(min_length=1, description="the scripts (each a list of turns)")
    choose: Literal["cycle", "seeded"] = Field(
        default="cycle", description="cycle: sample k plays variant k mod n; seeded: a draw keyed by (seed, k)"
    )
    seed: int = 0
    sample_index: int | None = Field(
        default=None, ge=0, description="choose for this sample index instead of the session's (polar generate runs "
        "each sample as a one-sample task, and sets it)"
    )


def choose_variant(count: int, sample_index: int, *, choose: Literal["cycle", "seeded"] = "cycle",
                   seed: int = 0) -> int:  # fmt: skip
    """Which of ``count`` variants sample ``sample_index`` plays: the same for the same (seed, sample index) in any
    process (a hash, not Python's salted ``hash`` or a shared random state)."""
    if choose == "cycle":
        return sample_index % count
    digest = hashlib.sha256(f"{seed}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


class ScriptSet:
    """A loaded script: one list of turns, or variants of which each sample plays one."""

    __slots__ = ("choose", "pinned", "seed", "variants")

    def __init__(self, variants: list[list[ScriptTurn]], choose: Literal["cycle", "seeded"] = "cycle", seed: int = 0,
                 pinned: int | None = None) -> None:  # fmt: skip
        self.variants = variants
        self.choose = choose
        self.seed = seed
        self.pinned = pinned
        """The sample index the script itself names (``sample_index``), which wins over the session's."""

    def for_sample(self, sample_index: int) -> list[ScriptTurn]:
        sample_index = sample_index if self.pinned is None else self.pinned
        index = choose_variant(len(self.variants), sample_index, choose=self.choose, seed=self.seed)
        return self.variants[index]


class ScriptedConfig(StrictModel):
    """Options of the scripted backend."""

    script: list[Any] | dict[str, Any] | str | None = Field(
        default=None, description="turns or variants, or a JSON/YAML file holding them"
    )
    tokenizer: str | None = Field(default=None, description="HF tokenizer dir or id; default: the demo tokenizer")
    model: str = "polar-scripted"
    on_exhausted: Literal["final", "error"] = "final"
    exhausted_text: str = "[polar scripted backend] The script has no more turns; ending here."
    end_of_turn: str | None = None
    on_mismatch: Literal["error", "warn"] = Field(
        default="error", description="a request unlike its turn's expect: fail the call (409), or log and answer"
    )

    @field_validator("script", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        return str(value) if isinstance(value, Path) else value


def _inline(value: Any) -> Any:
    if not isinstance(value, list | dict):
        raise ValueError(f"{INLINE_SCRIPT_RULE}, not {type(value).__name__}")
    return value


InlineScript = Annotated[list[Any] | dict[str, Any], BeforeValidator(_inline)]
"""A session's own script: turns (or variants) given inline. Never a path: a session is created by a remote caller,
and a path would make the proxy read (or block on) any file it names."""


class ScriptedSessionOptions(StrictModel):
    """What one session may pass to the scripted backend (its allow-list)."""

    script: InlineScript | None = Field(default=None, description="this session's turns (a list, never a path)")
    sample_index: int = Field(default=0, ge=0, description="which variant of a script with variants it plays")


def load_script_set(source: list[Any] | dict[str, Any] | str | Path, *, where: str = "script") -> ScriptSet:
    """Validate a script (a list of turns, or ``{variants, choose, seed}``) given inline or as a JSON/YAML file path
    (operator configuration only). Every variant is checked, whichever sample plays it."""
    if isinstance(source, str | Path):
        where = str(source)
        data = read_data_file(source)
    else:
        data = source
    if isinstance(data, dict):
        spec = validate_model(ScriptVariants, data, source=where)
        variants = [_turns(v, f"{where}: variants[{k}]") for k, v in enumerate(spec.variants)]
        return ScriptSet(variants, spec.choose, spec.seed, spec.sample_index)
    return ScriptSet([_turns(data, where)])


def _turns(data: Any, where: str) -> list[ScriptTurn]:
    if not isinstance(data, list):
        raise ConfigError(f"{where}: a script is a list of assistant messages, got {type(data).__name__}")
    return validate_model(Script, {"turns": data}, source=where).turns


def load_script(source: list[Any] | dict[str, Any] | str | Path, *, where: str = "script",
                sample_index: int = 0) -> list[ScriptTurn]:  # fmt: skip
    """The turns sample ``sample_index`` plays of a script given inline or as a file (see :func:`load_script_set`)."""
    return load_script_set(source, where=where).for_sample(sample_index)


def _logprob(token_id: int, position: int) -> float:
    """A deterministic, plausible logprob in [-0.997, -0.001]."""
    return -((token_id * 7919 + position * 104729) % 997 + 1) / 1000.0


class _Cursor:
    __slots__ = ("diverged", "position", "turns")

    def __init__(self, turns: list[ScriptTurn]) -> None:
        self.turns = turns
        self.position = 0
        self.diverged: str | None = None
        """Why a replayed request differed from its turn's ``expect``: every later call of the session fails so."""


def _halves(text: str | None) -> list[str]:
    if not text:
        return []
    cut = max(1, len(text) // 2)
    return [piece for piece in (text[:cut], text[cut:]) if piece]


def _slices(ids: list[int], n: int) -> list[list[int]]:
    """``ids`` cut into ``n`` consecutive slices as even as possible (some empty when there are fewer ids)."""
    size, extra = divmod(len(ids), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(ids[start:end])
        start = end
    return out


def stream_chunks(generation: Generation) -> list[dict[str, Any]]:
    """The chunks vLLM would stream for ``generation`` (``return_token_ids``, ``include_usage``): the first carries
    ``prompt_token_ids``; reasoning, content and each tool call's arguments come in pieces, the response ids and their
    logprobs split over them; the last id (end of turn) rides on the finish chunk; a usage chunk ends the stream.
    Assembled again (:class:`polar_cli.proxy.streaming.StreamAssembler`), they are ``generation`` itself."""
    message = generation.message
    deltas: list[dict[str, Any]] = [{"reasoning_content": p} for p in _halves(message.get("reasoning_content"))]
    deltas += [{"content": p} for p in _halves(message.get("content"))]
    for index, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        head = {"index": index, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
        deltas.append({"tool_calls": [head]})
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in _halves(fn["arguments"])]
    ids = generation.response_ids
    logprobs = generation.response_logprobs or [0.0] * len(ids)
    tokens = generation.response_tokens or [""] * len(ids)
    entries = [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(tokens, logprobs, strict=True)
    ]
    head = {
        "id": generation.id,
        "object": "chat.completion.chunk",
        "created": generation.created,
        "model": generation.model,
    }

    def chunk(delta: dict[str, Any], start: int, end: int, finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": entries[start:end]} if end > start else None,
            "finish_reason": finish,
            "token_ids": ids[start:end],
        }
        return {**head, **extra, "choices": [choice]}

    out = [chunk({"role": "assistant", "content": ""}, 0, 0, prompt_token_ids=list(generation.prompt_ids))]
    body = len(ids) - 1 if ids else 0  # the last id comes with the finish chunk
    start = 0
    for delta, part in zip(deltas, _slices(list(range(body)), len(deltas)) if deltas else [], strict=True):
        out.append(chunk(delta, start, start + len(part)))
        start += len(part)
    out.append(chunk({}, start, len(ids), generation.finish_reason))
    usage = {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
    }
    out.append({**head, "choices": [], "usage": usage})
    return out


class ScriptedStream:
    """A scripted turn streamed as vLLM's chunks (already generated: nothing to stop)."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self._chunks = chunks
        self._aborted = False

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        for chunk in self._chunks:
            if self._aborted:
                return
            yield chunk
            await asyncio.sleep(0)  # one chunk per loop turn, like a real upstream

    def abort(self) -> None:
        self._aborted = True


class ScriptedClient(BackendClient):
    name = "scripted"
    session_options = ScriptedSessionOptions
    streams_token_ids = True
    token_in = True
    """Token mode: a token prompt is answered like any other (the script's turn), recorded as the prompt given."""

    def __init__(self, config: ScriptedConfig) -> None:
        self.config = config
        self.default_script = load_script_set(config.script) if config.script is not None else ScriptSet([[]])
        self.renderer = ChatRenderer(load_tokenizer(config.tokenizer), config.end_of_turn)
        self._cursors: dict[str, _Cursor] = {}

    @property
    def default_turns(self) -> list[ScriptTurn]:
        """What a session with no script of its own plays (sample 0's variant of ``--script``)."""
        return self.default_script.for_sample(0)

    async def open_session(self, session_id: str, options: Mapping[str, Any]) -> None:
        opened = validate_model(ScriptedSessionOptions, dict(options), source=f"session {session_id}")
        script = self.default_script
        if opened.script is not None:
            script = load_script_set(opened.script, where=f"session {session_id} script")
        self._cursors[session_id] = _Cursor(script.for_sample(opened.sample_index))

    async def close_session(self, session_id: str) -> None:
        self._cursors.pop(session_id, None)

    async def models(self) -> list[str]:
        return [self.config.model]

    async def count_tokens(self, request: ChatRequest) -> int:
        size = text_chars(request.messages, request.tools)
        ids = await off_loop(size, self.renderer.prompt_ids, request.messages, request.tools, request.prompt_budget)
        return len(ids)

    def _cursor(self, session_id: str) -> _Cursor:
        cursor = self._cursors.get(session_id)
        if cursor is None:
            cursor = self._cursors[session_id] = _Cursor(self.default_turns)
        return cursor

    def _next_turn(self, session_id: str) -> tuple[int, ScriptTurn | None]:
        cursor = self._cursor(session_id)
        if cursor.diverged is not None:  # a harness retrying the failed call must not be answered by the next turn
            raise BackendError(cursor.diverged, status=409)
        position = cursor.position
        cursor.position += 1
        return position, cursor.turns[position] if position < len(cursor.turns) else None

    def _message(self, session_id: str, position: int, turn: ScriptTurn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.reasoning_content is not None:
            message["reasoning_content"] = turn.reasoning_content
        calls = []
        for k, call in enumerate(turn.tool_calls):
            args = call.function.arguments
            if not isinstance(args, str):
                args = orjson.dumps(args).decode()
            call_id = call.id or "call_" + hashlib.sha256(f"{session_id}/{position}/{k}".encode()).hexdigest()[:24]
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": call.function.name, "arguments": args}}
            )
        if calls:
            message["tool_calls"] = calls
        return message

    async def render(self, request: ChatRequest, *, add_generation_prompt: bool = True) -> Rendered:
        size = text_chars(request.messages, request.tools)
        ids = await off_loop(size, self.renderer.conversation_ids, request.messages, request.tools,
                             add_generation_prompt, request.prompt_budget)  # fmt: skip
        return Rendered(ids=ids)

    def _render(self, request: ChatRequest, message: dict[str, Any], turn: ScriptTurn) -> tuple[list[int], list[int]]:
        given = request.token_prompt
        if given is not None:
            prompt_ids = list(given.ids)
        else:
            prompt_ids = self.renderer.prompt_ids(request.messages, request.tools, request.prompt_budget)
        if turn.response_ids is not None:
            return prompt_ids, list(turn.response_ids)
        return prompt_ids, self.renderer.turn_ids(request.messages, request.tools, message)

    def _check_expected(self, request: ChatRequest, session_id: str, position: int, turn: ScriptTurn) -> None:
        """A replayed turn: the request must be the original's (its session's own paths aside)."""
        if turn.expect is None:
            return
        messages = mask_session(request.messages, session_id)
        tools = mask_session(request.tools, session_id)
        diverged = divergence(turn.expect, messages, tools)
        if diverged is None:
            return
        problem = f"scripted replay: session {session_id}, call {position + 1}: {diverged}"
        log.warning("%s", problem)
        if self.config.on_mismatch == "error":
            self._cursor(session_id).diverged = problem
            raise BackendError(problem, status=409)

    def _check_ids(self, session_id: str, position: int, turn: ScriptTurn) -> None:
        size = len(self.renderer.tokenizer)
        if turn.response_ids is not None and any(not 0 <= t < size for t in turn.response_ids):
            raise BackendError(f"scripted backend: turn {position + 1} of session {session_id} carries token ids "
                               f"outside the tokenizer's vocabulary ({size}): give the tokenizer the script was "
                               "recorded with (--tokenizer)")  # fmt: skip

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        started = time.perf_counter()
        position, turn = self._next_turn(session_id)
        if turn is None:
            if self.config.on_exhausted == "error":
                raise BackendError(f"scripted backend: the script of session {session_id} has no turn {position + 1}")
            turn = ScriptTurn(content=self.config.exhausted_text)
        self._check_expected(request, session_id, position, turn)
        if turn.error is not None:
            raise BackendError(turn.error.message, status=turn.error.status)
        self._check_ids(session_id, position, turn)
        message = self._message(session_id, position, turn)
        try:
            prompt_ids, response_ids = await off_loop(
                text_chars(request.messages, request.tools) + text_chars([message]), self._render, request, message,
                turn,
            )  # fmt: skip
        except PromptTooLongError:
            cursor = self._cursor(session_id)
            if cursor.position == position + 1:
                cursor.position = position  # a prompt refused is no call: its turn answers the next one
            raise
        finish = turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop")
        logprobs = turn.logprobs if turn.logprobs is not None else [_logprob(t, i) for i, t in enumerate(response_ids)]
        return Generation(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            model=self.config.model,
            message=message,
            finish_reason=finish,
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_logprobs=list(logprobs),
            response_tokens=self.renderer.tokens(response_ids),
            token_source="backend",
            backend=self.name,
            backend_seconds=time.perf_counter() - started,
            created=int(time.time()),
        )

    async def open_stream(self, request: ChatRequest, *, session_id: str) -> UpstreamStream:
        """The session's next turn as vLLM's streaming chunks; a scripted error is raised here, before any chunk."""
        return ScriptedStream(stream_chunks(await self.generate(request, session_id=session_id)))
