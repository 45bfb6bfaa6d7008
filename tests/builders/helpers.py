"""Hand-made completions for exact, hand-checked expectations (Qwen token ids)."""

from __future__ import annotations

from typing import Any

from polar_cli.models import Completion

IM_START, IM_END, NL, NLNL, USER, ASSISTANT = 151644, 151645, 198, 271, 872, 77091
GEN = [IM_START, ASSISTANT, NL]  # "<|im_start|>assistant\n"
SYSTEM_MESSAGE = {"role": "system", "content": "harness system prompt"}


def user_turn(*text: int) -> list[int]:
    """``<|im_start|>user\\n TEXT <|im_end|>\\n``"""
    return [IM_START, USER, NL, *text, IM_END, NL]


def completion(
    index: int,
    prompt: list[int],
    response: list[int],
    *,
    logprobs: list[float] | None = None,
    finish: str = "stop",
    messages: list[dict[str, Any]] | None = None,
    answer: dict[str, Any] | None = None,
    session: str = "s1",
    **extra: Any,
) -> Completion:
    return Completion(
        completion_id=f"c{index}",
        session_id=session,
        index=index,
        provider="openai_chat",
        model="m",
        request={},
        request_messages=messages or [SYSTEM_MESSAGE, {"role": "user", "content": f"turn {index}"}],
        response_message=answer or {"role": "assistant", "content": f"answer {index}"},
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=logprobs if logprobs is not None else [-0.5 - index - j / 100 for j in range(len(response))],
        finish_reason=finish,
        started_at=float(index),
        finished_at=index + 0.5,
        **extra,
    )


def decode_spans(trace: Any) -> list[tuple[int, list[int]]]:
    """(mask, ids) runs of a trace's response, for compact assertions."""
    spans: list[tuple[int, list[int]]] = []
    for token, bit in zip(trace.response_ids, trace.loss_mask, strict=True):
        if spans and spans[-1][0] == bit:
            spans[-1][1].append(token)
        else:
            spans.append((bit, [token]))
    return spans


SYSTEM = [IM_START, 8948, NL, 100, 101, IM_END, NL]  # "<|im_start|>system\n..."


def call(name: str, arguments: str, id: str = "call_0") -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


TASK_MESSAGES = [SYSTEM_MESSAGE, {"role": "user", "content": "200 201"}]


def three_turn_session() -> list:
    """Tool call (re-serialized in the next prompt), a truncated turn, then a final answer; each request repeats the
    one before and its answer, message for message. One chain under ``merge: prompt_prefix``; under the default
    exact rule three (``history_rerendered``, then ``truncated_reply``)."""
    p1 = [*SYSTEM, *user_turn(200, 201), *GEN]
    a1 = [300, 301, 302, IM_END]  # sampled `{"a":1}`; the template renders it as 300, 399, 302
    p2 = [*p1, 300, 399, 302, IM_END, NL, *user_turn(400), *GEN]
    a2 = [310, 311]  # cut off: finish_reason "length", no <|im_end|>
    p3 = [*p2, 310, 311, IM_END, NL, *user_turn(401, 402), *GEN]
    a3 = [320, IM_END]
    answer1 = {"role": "assistant", "content": None, "tool_calls": [call("run", '{"a":1}')]}
    echoed1 = {"role": "assistant", "content": None, "tool_calls": [call("run", '{"a": 1}')]}  # re-serialized
    answer2 = {"role": "assistant", "content": "cut sh"}
    m2 = [*TASK_MESSAGES, echoed1, {"role": "user", "content": "400"}]
    m3 = [*m2, answer2, {"role": "user", "content": "401 402"}]
    return [
        completion(0, p1, a1, logprobs=[-0.1, -0.2, -0.3, -0.01], finish="tool_calls", messages=TASK_MESSAGES,
                   answer=answer1),
        completion(1, p2, a2, logprobs=[-1.0, -1.1], finish="length", messages=m2, answer=answer2),
        completion(2, p3, a3, logprobs=[-2.0, -0.02], messages=m3),
    ]


def exact_session() -> list:
    """Three turns whose every next prompt holds the ids sampled before it, verbatim (as token-in/token-out does):
    one chain under either rule, every completion in the context it was sampled in."""
    p1 = [*SYSTEM, *user_turn(200, 201), *GEN]
    a1 = [300, 301, 302, IM_END]
    p2 = [*p1, *a1, NL, *user_turn(400), *GEN]
    a2 = [310, 311, IM_END]
    p3 = [*p2, *a2, NL, *user_turn(401, 402), *GEN]
    a3 = [320, IM_END]
    answer1 = {"role": "assistant", "content": None, "tool_calls": [call("run", '{"a":1}')]}
    answer2 = {"role": "assistant", "content": "310 311"}
    m2 = [*TASK_MESSAGES, answer1, {"role": "user", "content": "400"}]
    m3 = [*m2, answer2, {"role": "user", "content": "401 402"}]
    return [
        completion(0, p1, a1, logprobs=[-0.1, -0.2, -0.3, -0.01], finish="tool_calls", messages=TASK_MESSAGES,
                   answer=answer1),
        completion(1, p2, a2, logprobs=[-1.0, -1.1, -0.03], messages=m2, answer=answer2),
        completion(2, p3, a3, logprobs=[-2.0, -0.02], messages=m3),
    ]


def drifting_session() -> list[Completion]:
    """Four turns: the second prompt holds the first reply exactly, the third re-renders the second's tool call
    (sampled 311, rendered 399), the fourth holds the third reply exactly."""
    p1 = [*SYSTEM, *user_turn(200), *GEN]
    a1, a2, a3 = [300, IM_END], [310, 311, IM_END], [320, IM_END]
    p2 = [*p1, *a1, NL, *user_turn(4), *GEN]
    p3 = [*p2, 310, 399, IM_END, NL, *user_turn(5), *GEN]
    p4 = [*p3, *a3, NL, *user_turn(6), *GEN]
    answer2 = {"role": "assistant", "content": None, "tool_calls": [call("run", '{"a":1}')]}
    m2 = [*TASK_MESSAGES, {"role": "assistant", "content": "answer 0"}, {"role": "user", "content": "4"}]
    m3 = [*m2, {**answer2, "tool_calls": [call("run", '{"a": 1}')]}, {"role": "user", "content": "5"}]
    m4 = [*m3, {"role": "assistant", "content": "answer 2"}, {"role": "user", "content": "6"}]
    return [completion(0, p1, a1, messages=TASK_MESSAGES), completion(1, p2, a2, messages=m2, answer=answer2),
            completion(2, p3, a3, messages=m3), completion(3, p4, [330, IM_END], messages=m4)]  # fmt: skip
