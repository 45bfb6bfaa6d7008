"""Anthropic Messages request → normalized chat request (the decode half of the Anthropic codec).

- ``system`` (a string or text blocks), then the text of any ``role: "system"`` message in ``messages`` (Claude Code
  2.1 sends one for unknown model names) → ONE leading system message, blocks joined by blank lines. Claude Code's
  first system line ``x-anthropic-billing-header: ...`` changes on every call and would break token prefixes: it is
  removed.
- user blocks: ``text``; ``image`` (base64 or url source) → chat ``image_url`` parts; ``tool_result`` → ``tool``
  messages, in order, before the rest of that user message (its text and images, plus any images the tool results
  held, since chat tool messages are text only); ``document`` with a text source → text; anything else is dropped.
- assistant blocks: ``text`` (concatenated), ``thinking`` → ``reasoning_content`` (whatever its signature: this
  proxy's are deterministic, foreign ones are ignored), ``tool_use`` → ``tool_calls`` (``input`` as compact JSON);
  ``redacted_thinking`` and server-tool blocks are dropped.
- tools ``{name, description, input_schema}`` → function tools; Anthropic-defined and server tools (``web_search_*``,
  ``bash_*``, ``text_editor_*``, ...) have no schema here and are dropped. ``tool_choice`` auto/any/tool/none →
  auto/required/{function}/none; ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``.
- ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` (→ ``stop``) are kept; ``metadata``,
  ``thinking``, ``context_management``, ``output_config``, ``cache_control`` and every other unknown field are ignored.
"""

from __future__ import annotations

from typing import Any

from polar_cli.errors import ProtocolError, brief
from polar_cli.models.chat import ChatRequest
from polar_cli.proxy.codecs.common import (
    data_url_part,
    dump_arguments,
    each_object,
    function_tool,
    stable_id,
    tool_objects,
    url_part,
    user_content,
)

BILLING_HEADER = "x-anthropic-billing-header:"


def _text_blocks(value: Any, where: str) -> list[str]:
    """Texts of a string or a list of text blocks (non-text blocks are skipped)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ProtocolError(f"{where}: expected a string or a list of content blocks")
    out = []
    for k, block in enumerate(value):
        if isinstance(block, str):
            out.append(block)
        elif not isinstance(block, dict):
            raise ProtocolError(f"{where}[{k}]: each content block must be an object")
        elif block.get("type", "text") == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise ProtocolError(f"{where}[{k}].text must be a string")
            out.append(text)
    return out


def strip_billing_header(text: str) -> str:
    """``text`` without a leading ``x-anthropic-billing-header:`` line."""
    if not text.startswith(BILLING_HEADER):
        return text
    _, _, rest = text.partition("\n")
    return rest


def system_text(system: Any) -> str:
    blocks = _text_blocks(system, "system")
    for k, block in enumerate(blocks):
        if block.strip():  # the header is the first line of the first non-empty block
            blocks[k] = strip_billing_header(block)
            break
    return "\n\n".join(b for b in blocks if b)


def _image(block: dict[str, Any], where: str) -> dict[str, Any] | None:
    source = block.get("source")
    if not isinstance(source, dict):
        raise ProtocolError(f"{where}.source must be an object")
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise ProtocolError(f"{where}.source needs media_type and data strings")
        return data_url_part(media_type, data)
    if kind == "url" and isinstance(source.get("url"), str):
        return url_part(source["url"])
    return None  # file ids refer to Anthropic's Files API: nothing a local model can read


def _document_text(block: dict[str, Any]) -> str | None:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if isinstance(source, dict) and source.get("type") == "content":
        return "\n".join(_text_blocks(source.get("content"), "document.source.content")) or None
    return None


def _tool_result(block: dict[str, Any], where: str, images: list[dict[str, Any]]) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise ProtocolError(f"{where}.tool_use_id is required")
    content = block.get("content")
    texts: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for k, _, part in each_object(content, f"{where}.content"):
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image":
                image = _image(part, f"{where}.content[{k}]")
                if image is not None:
                    images.append(image)
            elif kind == "document":
                text = _document_text(part)
                if text is not None:
                    texts.append(text)
    elif content is not None:
        raise ProtocolError(f"{where}.content must be a string or a list of blocks")
    # is_error has no chat equivalent; harnesses already write the failure into the text, which is kept as is
    return {"role": "tool", "tool_call_id": call_id, "content": "\n".join(texts)}


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise ProtocolError(f"{where}.content must be a string or a list of content blocks")
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for _, at, block in each_object(content, f"{where}.content"):
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise ProtocolError(f"{at}.text must be a string")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            image = _image(block, at)
            if image is not None:
                parts.append(image)
        elif kind == "tool_result":
            tools.append(_tool_result(block, at, images))
        elif kind == "document":
            text = _document_text(block)
            if text is not None:
                parts.append({"type": "text", "text": text})
    parts = images + parts
    out = tools
    if parts:
        out.append({"role": "user", "content": user_content(parts)})
    return out


def _assistant(content: Any, where: str, index: int) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise ProtocolError(f"{where}.content must be a string or a list of content blocks")
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, at, block in each_object(content, f"{where}.content"):
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError(f"{at}.name is required")
            call_id = block.get("id") if isinstance(block.get("id"), str) else stable_id("toolu_", index, k, name)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": dump_arguments(block.get("input"))},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def decode_messages(raw: Any, system: list[str]) -> list[dict[str, Any]]:
    """Chat messages; the text of ``system`` messages found among them is appended to ``system``."""
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("'messages' must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, where, msg in each_object(raw, "messages"):
        role = msg.get("role")
        if role == "user":
            out.extend(_user(msg.get("content"), where))
        elif role == "assistant":
            out.append(_assistant(msg.get("content"), where, i))
        elif role == "system":  # Claude Code 2.1 sends these for unknown model names; templates want one system
            system.extend(t for t in _text_blocks(msg.get("content"), f"{where}.content") if t)
        else:
            raise ProtocolError(f"{where}.role must be 'user', 'assistant' or 'system'; got {brief(role)}")
    return out


def decode_tools(raw: Any) -> list[dict[str, Any]] | None:
    out = []
    for k, tool in tool_objects(raw):
        if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
            continue  # Anthropic-defined/server tools (web_search_*, bash_*, ...) cannot run on a local model
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"tools[{k}].name is required")
        if not isinstance(schema, dict):
            raise ProtocolError(f"tools[{k}].input_schema must be an object")
        out.append(function_tool(name, tool.get("description"), schema))
    return out or None  # vLLM rejects an empty tool list


def decode_tool_choice(raw: Any) -> tuple[str | dict[str, Any] | None, bool]:
    """(chat tool_choice, parallel tool use disabled)."""
    if raw is None:
        return None, False
    if not isinstance(raw, dict):
        raise ProtocolError('\'tool_choice\' must be an object such as {"type": "auto"}')
    kind = raw.get("type")
    no_parallel = bool(raw.get("disable_parallel_tool_use"))
    if kind == "auto":
        return "auto", no_parallel
    if kind == "any":
        return "required", no_parallel
    if kind == "none":
        return "none", no_parallel
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise ProtocolError("tool_choice.name is required when tool_choice.type is 'tool'")
        return {"type": "function", "function": {"name": raw["name"]}}, no_parallel
    raise ProtocolError(f"tool_choice.type must be auto, any, tool or none; got {brief(kind)}")


def decode_request(body: dict[str, Any], *, count_only: bool = False) -> ChatRequest:
    """Normalize a Messages (or ``count_tokens``, which has no ``max_tokens``) body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("'model' is required and must be a string")
    params: dict[str, Any] = {}
    max_tokens = body.get("max_tokens")
    if max_tokens is not None or not count_only:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ProtocolError("'max_tokens' is required and must be a positive integer")
        params["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ProtocolError(f"'{name}' must be a number")
            params[name] = value
    stop = body.get("stop_sequences")
    if stop:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ProtocolError("'stop_sequences' must be a list of strings")
        params["stop"] = stop
    system = [system_text(body.get("system"))]
    messages = decode_messages(body.get("messages"), system)
    system_prompt = "\n\n".join(t for t in system if t)
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    tools = decode_tools(body.get("tools"))
    choice, no_parallel = decode_tool_choice(body.get("tool_choice"))
    if tools and no_parallel:
        params["parallel_tool_calls"] = False
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=choice if tools else None,
        params=params,
        stream=bool(body.get("stream")) and not count_only,
        context={"stop_sequences": stop or []},
    )
