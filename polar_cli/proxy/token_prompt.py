"""Token mode: a call's prompt built as ids, so the model sees exactly what it sampled (docs/builders.md, "Token mode").

A harness sends its whole conversation as messages every call. In messages mode the server renders them with the chat
template, which re-renders earlier assistant turns: re-serialized tool-call JSON, arguments the harness normalized,
reasoning the template drops. The model then continues from a context it never produced, and a trace that splices the
sampled ids in its place is not the context the call was sampled under.

In tokens mode the proxy builds the prompt itself:

* the latest earlier assistant turn the harness echoes back that matches a completion recorded in this session (its
  request's messages are the messages before the turn, compared as :func:`polar_cli.builders.evidence.normalized`
  compares them) is the base: the prompt starts with that completion's exact prompt ids and exact sampled ids, end of
  turn included. A turn the harness changed (normalized arguments, edited text) is still that completion's turn: it
  is spliced, and the span says ``edited``;
* the rest (tool results, the next user turn, the generation prompt) is the template's rendering of the messages
  after that turn: the server renders the whole conversation and the tail after the base's last end-of-turn token is
  taken (every turn, spliced or rendered, closes with exactly one end-of-turn token);
* with ``keep_reasoning: false``, a base whose answer held reasoning is not spliced: the whole prompt is rendered, as
  the template drops reasoning, and the completion records ``reasoning_dropped`` (its chain breaks, on purpose);
* nothing matches (the first call, a sub-agent, compacted history): the whole prompt is rendered.

Because each base's own prompt was built the same way, a session's prompts extend each other id for id, and prefix
merging gives one context-exact chain per conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from polar_cli.builders.evidence import normalized
from polar_cli.errors import BackendError
from polar_cli.interfaces.backend import BackendClient
from polar_cli.models import PromptSpan
from polar_cli.models.chat import ChatRequest, TokenPrompt
from polar_cli.proxy.budget import too_long


@dataclass(slots=True)
class TokenTurn:
    """What a later call needs of one recorded completion of the session to splice it."""

    completion_id: str
    request_key: list[tuple[Any, ...]]
    response_key: tuple[Any, ...]
    has_reasoning: bool
    prompt_ids: list[int]
    response_ids: list[int]
    spans: list[PromptSpan]
    finish_reason: str | None


@dataclass
class TokenHistory:
    """One session's recorded completions, as token mode splices them, and its end-of-turn ids once known."""

    turns: list[TokenTurn] = field(default_factory=list)
    end_of_turn: set[int] = field(default_factory=set)

    def add(
        self,
        *,
        completion_id: str,
        request_messages: list[dict[str, Any]],
        response_message: dict[str, Any],
        prompt_ids: Sequence[int],
        response_ids: list[int],
        spans: list[PromptSpan] | None,
        finish_reason: str | None,
    ) -> None:
        prompt = list(prompt_ids)
        if finish_reason in ("stop", "tool_calls") and response_ids:
            self.end_of_turn.add(response_ids[-1])  # an answer that ended on its own ends with its end-of-turn id
        reasoning = response_message.get("reasoning_content") or response_message.get("reasoning")
        self.turns.append(
            TokenTurn(
                completion_id=completion_id,
                request_key=[normalized(m) for m in request_messages],
                response_key=normalized(response_message),
                has_reasoning=bool(reasoning),
                prompt_ids=prompt,
                response_ids=list(response_ids),
                spans=spans or [PromptSpan(start=0, end=len(prompt), source="rendered")],
                finish_reason=finish_reason,
            )
        )


@dataclass(frozen=True)
class _Match:
    turn: TokenTurn
    after: int
    """Index of the first message after the echoed assistant turn."""
    edited: bool


def _assistant_turn(messages: list[dict[str, Any]], start: int) -> tuple[dict[str, Any], int] | None:
    """The assistant turn at ``start`` (consecutive assistant messages merged: some harnesses split text and tool
    calls), and the index after it; None when ``messages[start]`` is not an assistant message."""
    end = start
    while end < len(messages) and messages[end].get("role") == "assistant":
        end += 1
    if end == start:
        return None
    turn = messages[start:end]
    texts = [m.get("content") for m in turn if isinstance(m.get("content"), str | list) and m.get("content")]
    merged: dict[str, Any] = {"role": "assistant", "content": texts[0] if len(texts) == 1 else None}
    if len(texts) > 1:
        merged["content"] = "\n".join(t if isinstance(t, str) else normalized({"content": t})[1] for t in texts)
    merged["tool_calls"] = [call for m in turn for call in m.get("tool_calls") or []]
    return merged, end


def find_base(messages: list[dict[str, Any]], history: TokenHistory) -> _Match | None:
    """The recorded completion whose answer is the latest assistant turn the messages echo back (see the module
    docstring); an exact echo wins over an edited one at the same place, then the most recent completion."""
    keys = [normalized(m) for m in messages]
    best: _Match | None = None
    for turn in reversed(history.turns):
        n = len(turn.request_key)
        if n >= len(messages) or (best is not None and n < _start(best)) or keys[:n] != turn.request_key:
            continue
        found = _assistant_turn(messages, n)
        if found is None:
            continue
        echoed, after = found
        match = _Match(turn, after, normalized(echoed) != turn.response_key)
        if best is None or _rank(match) > _rank(best):
            best = match
    return best


def _start(match: _Match) -> int:
    return len(match.turn.request_key)


def _rank(match: _Match) -> tuple[int, bool]:
    return _start(match), not match.edited


def _turn_ends(ids: Sequence[int], end_of_turn: set[int]) -> list[int]:
    return [i for i, token in enumerate(ids) if token in end_of_turn]


def _add(spans: list[PromptSpan], start: int, end: int, source: str, **extra: Any) -> None:
    if end <= start:
        return
    last = spans[-1] if spans else None
    if source == "rendered" and last is not None and last.source == "rendered" and last.end == start:
        spans[-1] = last.model_copy(update={"end": end})
        return
    spans.append(PromptSpan(start=start, end=end, source=source, **extra))  # type: ignore[arg-type]


def splice(
    rendered: list[int], match: _Match | None, history: TokenHistory, *, keep_reasoning: bool
) -> TokenPrompt:
    """The prompt for a call whose whole conversation the template renders as ``rendered``, given its base."""
    whole = [PromptSpan(start=0, end=len(rendered), source="rendered")] if rendered else []
    if match is None:
        return TokenPrompt(ids=list(rendered), spans=whole)
    turn = match.turn
    if turn.has_reasoning and not keep_reasoning:
        return TokenPrompt(ids=list(rendered), spans=whole, base=turn.completion_id, reasoning_dropped=True)
    if not history.end_of_turn:
        raise BackendError("token mode: the model's end-of-turn token is not known yet; cannot splice", status=500)
    closed = bool(turn.response_ids) and turn.response_ids[-1] in history.end_of_turn
    # every turn before the base's answer closes with one end-of-turn id, rendered or spliced alike; the base's
    # answer closes with the next one (its own when it sampled it, else the template's)
    ends = _turn_ends(rendered, history.end_of_turn)
    closes = len(_turn_ends(turn.prompt_ids, history.end_of_turn))
    if closes >= len(ends):
        raise BackendError(
            f"token mode: the rendered conversation has {len(ends)} end-of-turn tokens, fewer than the "
            f"{closes + 1} that the turns up to completion {turn.completion_id} close with",
            status=500,
        )
    cut = ends[closes]  # the end-of-turn id closing the base's answer in the rendering
    ids = [*turn.prompt_ids, *turn.response_ids]
    spans = [span.model_copy() for span in turn.spans]
    start = len(turn.prompt_ids)
    _add(spans, start, len(ids), "spliced", completion_id=turn.completion_id, edited=match.edited)
    tail = rendered[cut + (1 if closed else 0) :]
    _add(spans, len(ids), len(ids) + len(tail), "rendered")
    ids += tail
    return TokenPrompt(ids=ids, spans=spans, base=turn.completion_id, edited=match.edited)


def learn_end_of_turn(history: TokenHistory, probe: list[int] | None) -> None:
    """Take the end-of-turn id from a render probe (see ``end_of_turn_probe``) while no completion has told it."""
    if not history.end_of_turn and probe:
        history.end_of_turn.add(probe[0])


END_OF_TURN_PROBE = (
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
)
"""Two conversations whose renderings differ by an empty assistant turn: what follows the generation prompt in the
second starts with the template's end-of-turn token."""


def probe_tail(with_prompt: list[int], closed: list[int]) -> list[int] | None:
    """The tokens an empty assistant turn adds after the generation prompt (its end-of-turn first), or None when
    the template does not render it as an extension."""
    if len(closed) <= len(with_prompt) or closed[: len(with_prompt)] != with_prompt:
        return None
    return closed[len(with_prompt) :]


def needs_probe(match: _Match | None, history: TokenHistory) -> bool:
    return match is not None and not history.end_of_turn


async def build_token_prompt(
    chat: ChatRequest, history: TokenHistory, backend: BackendClient, *, keep_reasoning: bool
) -> TokenPrompt:
    """Render the call's whole conversation on the backend, find its base and splice (see the module docstring)."""
    rendered = await backend.render(chat)
    if chat.prompt_budget is not None and len(rendered.ids) > chat.prompt_budget:
        raise too_long(f"{len(rendered.ids)} tokens rendered", chat.prompt_budget)
    match = find_base(chat.messages, history)
    if needs_probe(match, history) and not (match is not None and match.turn.has_reasoning and not keep_reasoning):
        learn_end_of_turn(history, await _probe(chat, backend))
    prompt = splice(rendered.ids, match, history, keep_reasoning=keep_reasoning)
    prompt.upstream = rendered.upstream
    prompt.rendered_len = len(rendered.ids)
    return prompt


async def _probe(chat: ChatRequest, backend: BackendClient) -> list[int] | None:
    with_prompt, closed = (
        ChatRequest(model=chat.model, messages=[dict(m) for m in messages], params={"max_tokens": 1})
        for messages in END_OF_TURN_PROBE
    )
    first = await backend.render(with_prompt, add_generation_prompt=True)
    second = await backend.render(closed, add_generation_prompt=False)
    return probe_tail(first.ids, second.ids)
