"""OpenAI Responses request → normalized chat request (the decode half of the Responses codec).

What Codex CLI sends, and how it maps:

- ``instructions`` and every text block of every ``system``/``developer`` message item, wherever it stands → ONE
  leading system message (blocks joined by blank lines, in order): several chat templates reject a second system
  message. (A developer item appended mid-conversation therefore changes the system prompt of that call.)
- ``message`` items (user/assistant; content a string or input_text/output_text/refusal/input_image/input_file parts;
  user text parts joined by newlines, assistant parts concatenated).
- An assistant turn is the run of ``reasoning``, assistant ``message``, ``function_call`` and ``custom_tool_call``
  items between two non-assistant items; it becomes ONE assistant message (``reasoning_content``, ``content``,
  ``tool_calls``). A reasoning item, or a message after content/calls, starts a new turn, which is exactly how the
  codec's own output (reasoning?, message?, calls*) comes back.
- ``function_call_output`` / ``custom_tool_call_output`` → ``tool`` messages.
- ``reasoning.encrypted_content`` made by this proxy is the sealed reasoning text (``common.seal_thought``) and
  restores the exact text; foreign values are ignored in favour of ``content``/``summary`` text.
- Other ``*_call`` items with a ``call_id`` (e.g. ``local_shell_call``) become a tool call named after the item type
  with the rest of the item as JSON arguments, and their ``*_call_output`` a tool message; hosted-tool items without a
  ``call_id`` (``web_search_call``, ``compaction``, ``item_reference``...) carry nothing a chat model can read and
  are dropped.
- Tools, ``tool_choice`` and ``text.format``: see :mod:`openai_responses_tools`.
"""

from __future__ import annotations

import json
from typing import Any

from polar_cli.errors import ProtocolError, brief
from polar_cli.models.chat import ChatRequest
from polar_cli.proxy.codecs.common import unseal_thought, user_content
from polar_cli.proxy.codecs.openai_responses_tools import (
    TOOL_SEARCH,
    chat_tools,
    custom_arguments,
    discovered_tools,
    response_format,
    tool_choice,
)

# Response fields echoed back from the request (the API echoes them on every Response object).
_ECHO_FIELDS = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "prompt_cache_key",
    "reasoning",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "user",
)
_ASSISTANT_ITEMS = frozenset({"function_call", "custom_tool_call"})


def decode_request(body: dict[str, Any]) -> ChatRequest:
    """Normalize a ``POST /v1/responses`` body; raise ProtocolError (a 400) when it is malformed."""
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("'model' is required and must be a string")
    for stateful in ("previous_response_id", "conversation"):
        if body.get(stateful):
            raise ProtocolError(f"'{stateful}' is not supported: this proxy stores no responses; send the full input")
    tools, context = chat_tools(body.get("tools"), discovered_tools(body.get("input")))
    messages = _messages(body.get("instructions"), body.get("input"))
    params: dict[str, Any] = {}
    if body.get("max_output_tokens") is not None:
        params["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            params[key] = body[key]
    if tools and isinstance(body.get("parallel_tool_calls"), bool):
        params["parallel_tool_calls"] = body["parallel_tool_calls"]
    text_format = response_format(body.get("text"))
    if text_format is not None:
        params["response_format"] = text_format
    include = body.get("include") or []
    context["encrypted_reasoning"] = isinstance(include, list) and "reasoning.encrypted_content" in include
    context["logprobs"] = isinstance(include, list) and "message.output_text.logprobs" in include
    context["echo"] = {key: body[key] for key in _ECHO_FIELDS if key in body}
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools or None,
        tool_choice=tool_choice(body.get("tool_choice")) if tools else None,
        params=params,
        stream=bool(body.get("stream")),
        context=context,
    )


# --- input items -------------------------------------------------------------------------------------------------


def _messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    system: list[str] = []
    if isinstance(instructions, str) and instructions:
        system.append(instructions)
    elif instructions is not None and not isinstance(instructions, str):
        raise ProtocolError("'instructions' must be a string")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    elif items is None:
        items = []
    elif not isinstance(items, list):
        raise ProtocolError("'input' must be a string or a list of items")
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being assembled from consecutive items
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError(f"input[{index}] must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind is not None and not isinstance(kind, str):
            raise ProtocolError(f"input[{index}].type must be a string; got {brief(kind)}")
        role = item.get("role")
        if kind == "message" and role in ("system", "developer"):
            text = _text_of(item.get("content"), index, "\n\n")
            if text:
                system.append(text)
            continue
        if kind == "message" and role == "assistant":
            text = _text_of(item.get("content"), index, "")
            if turn is None or turn.get("content") is not None or turn.get("tool_calls"):
                turn = _new_turn(out)
            turn["content"] = text
            continue
        if kind == "reasoning":
            reasoning = _reasoning_text(item)
            if reasoning is None:
                continue  # nothing readable (a foreign encrypted blob): the turn is unchanged
            if turn is None or _turn_started(turn):
                turn = _new_turn(out)
            previous = turn.get("reasoning_content")
            turn["reasoning_content"] = f"{previous}\n\n{reasoning}" if previous else reasoning
            continue
        if isinstance(kind, str) and (kind in _ASSISTANT_ITEMS or _is_generic_call(kind, item)):
            if turn is None:
                turn = _new_turn(out)
            _add_tool_call(turn, kind, item, index)
            continue
        turn = None
        if kind == "message":
            if role != "user":
                raise ProtocolError(f"input[{index}]: unsupported message role {brief(role)}")
            out.append({"role": "user", "content": _user_content(item.get("content"), index)})
        elif kind in ("function_call_output", "custom_tool_call_output") or _is_generic_output(kind, item):
            out.append(_tool_message(item, index))
        elif kind == "tool_search_output" and isinstance(item.get("call_id"), str):
            # the discovered tools join this request's tool list; the model also reads them as the call's result
            found = json.dumps(item.get("tools") or [], ensure_ascii=False)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": found})
        elif kind is None:
            raise ProtocolError(f"input[{index}] has no 'type'")
        # anything else (hosted-tool calls without a call_id, references, compaction blobs) is dropped on purpose
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return out


def _new_turn(out: list[dict[str, Any]]) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": None}
    out.append(turn)
    return turn


def _turn_started(turn: dict[str, Any]) -> bool:
    """A reasoning item after content or calls opens the next assistant turn."""
    return turn.get("content") is not None or bool(turn.get("tool_calls"))


def _is_generic_call(kind: Any, item: dict[str, Any]) -> bool:
    call_id = item.get("call_id")
    return isinstance(kind, str) and kind.endswith("_call") and isinstance(call_id, str) and bool(call_id)


def _is_generic_output(kind: Any, item: dict[str, Any]) -> bool:
    return isinstance(kind, str) and kind.endswith("_call_output") and "call_id" in item


def _add_tool_call(turn: dict[str, Any], kind: str, item: dict[str, Any], index: int) -> None:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ProtocolError(f"input[{index}] ({kind}) needs a string 'call_id'")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
    elif kind == "custom_tool_call":
        name, raw = item.get("name"), item.get("input", "")
        arguments = custom_arguments(raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False))
    elif kind == "tool_search_call":
        name, arguments = TOOL_SEARCH, json.dumps(item.get("arguments") or {}, ensure_ascii=False)
    else:  # e.g. local_shell_call: keep what the model asked for as the arguments of a tool named after the item
        name = kind
        rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        arguments = json.dumps(rest, ensure_ascii=False)
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"input[{index}] ({kind}) needs a string 'name'")
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    turn.setdefault("tool_calls", []).append(call)


def _reasoning_text(item: dict[str, Any]) -> str | None:
    sealed = unseal_thought(item.get("encrypted_content"))
    if sealed is not None:
        return sealed
    for field in ("content", "summary"):
        parts = item.get(field)
        if isinstance(parts, list):
            texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if texts:
                return "\n\n".join(texts)
    return None


def _tool_message(item: dict[str, Any], index: int) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ProtocolError(f"input[{index}] ({brief(item.get('type'))}) needs a string 'call_id'")
    output = item.get("output", "")
    if isinstance(output, list):
        content: Any = _parts(output, index, "output")
    elif isinstance(output, str):
        content = output
    elif isinstance(output, dict) and isinstance(output.get("content"), str):
        content = output["content"]  # older clients wrap the text as {content, success}
    else:
        content = json.dumps(output, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _text_of(content: Any, index: int, separator: str) -> str:
    """Text of a system/developer message (blocks joined by blank lines) or an assistant message (parts joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"input[{index}].content must be a string or a list of content parts")
    _parts(content, index, "content")  # validates the parts
    texts = [p.get("text", p.get("refusal")) for p in content]
    return separator.join(t for t in texts if isinstance(t, str))


def _user_content(content: Any, index: int) -> Any:
    return content if isinstance(content, str) else _parts(content, index, "content")


def _parts(parts: Any, index: int, field: str) -> Any:
    """Responses content parts → chat content: a plain string when all text, else chat parts."""
    if not isinstance(parts, list):
        raise ProtocolError(f"input[{index}].{field} must be a string or a list of content parts")
    out: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, dict):
            raise ProtocolError(f"input[{index}].{field} parts must be objects")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            out.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            out.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise ProtocolError(f"input[{index}]: input_image needs an 'image_url' (file_id is not supported)")
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            out.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            if not part.get("file_data"):
                raise ProtocolError(f"input[{index}]: input_file needs 'file_data' (file_id/file_url unsupported)")
            file = {k: part[k] for k in ("file_data", "filename") if part.get(k)}
            out.append({"type": "file", "file": file})
        else:
            raise ProtocolError(f"input[{index}]: unsupported content part type {brief(kind)}")
    return user_content(out)


# --- tools, tool_choice, text format -----------------------------------------------------------------------------
