"""Does a later request continue an earlier completion's response? Token and message evidence.

Prefix merging under the paper's rule (``merge: prompt_prefix``) needs this where the token prefix alone is ambiguous:
parallel samples share a prompt, so a later call's prompt extends every sibling's prompt, yet its history holds only
one sibling's response (the exact rule reads it from the sampled ids; its break diagnosis still uses the messages).
Messages are compared the way harnesses tend to replay them: role, text (stripped, without a leading ``<think>``
block) and tool calls (name, parsed arguments); reasoning fields and tool-call ids are ignored, and consecutive
assistant messages are merged (some harnesses split text and tool calls into separate items).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from polar_cli.models import Completion

_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


def replays_tokens(last: Completion, new: Completion, eot_ids: frozenset[int]) -> bool:
    """The new prompt, right after ``last``'s prompt, holds ``last``'s sampled tokens (end-of-turn aside)."""
    sampled = last.response_ids
    if sampled and sampled[-1] in eot_ids:
        sampled = sampled[:-1]
    start = len(last.prompt_ids)
    return new.prompt_ids[start : start + len(sampled)] == sampled


def replays_message(last: Completion, new: Completion) -> bool | None:
    """The first assistant turn after ``last``'s messages equals ``last``'s response; None when there is none."""
    later = new.request_messages[len(last.request_messages) :]
    start = next((i for i, m in enumerate(later) if m.get("role") == "assistant"), None)
    if start is None:
        return None
    turn = []
    for message in later[start:]:
        if message.get("role") != "assistant":
            break
        turn.append(message)
    merged = {
        "role": "assistant",
        "content": "\n".join(_text(m) for m in turn if _text(m)),
        "tool_calls": [call for m in turn for call in m.get("tool_calls") or []],
    }
    return normalized(merged) == normalized(last.response_message)


def continues(
    last: Completion, new: Completion, eot_ids: frozenset[int], siblings: Callable[[], Iterable[Completion]]
) -> bool:
    """False only when ``new``'s history demonstrably holds a sibling's response instead of ``last``'s.

    ``siblings`` lists the other completions with ``last``'s exact prompt; it is called only when the tokens do not
    already show that ``last``'s response is replayed. Without contrary evidence the answer is yes (the paper's
    prefix rule), so a harness that reshapes messages does not split chains needlessly.
    """
    if replays_tokens(last, new, eot_ids):
        return True
    others = [s for s in siblings() if s is not last]
    if not others:
        return True
    mine = replays_message(last, new)
    if mine:
        return True
    return not any(replays_tokens(s, new, eot_ids) or replays_message(s, new) for s in others)


def messages_extend(previous: Completion, new: Completion) -> bool:
    """The new request repeats the previous request and response, message for message."""
    before = [*previous.request_messages, previous.response_message]
    if len(new.request_messages) < len(before):
        return False
    return [normalized(m) for m in before] == [normalized(m) for m in new.request_messages[: len(before)]]


def first_message(completion: Completion) -> Any:
    return normalized(completion.request_messages[0]) if completion.request_messages else None


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and "text" in p)
    return _THINK.sub("", content or "").strip() if isinstance(content, str) else ""


def normalized(message: dict[str, Any]) -> tuple[Any, ...]:
    """Role, text and tool calls (arguments parsed), ignoring reasoning that harnesses and templates often drop."""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        calls.append((fn.get("name"), json.dumps(args, sort_keys=True, default=str)))
    return message.get("role"), _text(message), tuple(calls)
