"""Responses tool definitions → chat function tools, plus tool_choice and ``text.format``.

- ``function`` tools → chat function tools (``strict`` kept only when true).
- ``custom`` tools (freeform, e.g. Codex's ``apply_patch``) → a function with one string parameter ``input`` whose
  description carries the format/grammar; listed in ``context["custom_tools"]`` so the model's call is answered as a
  ``custom_tool_call`` (:func:`custom_input` takes the text back out of the arguments).
- ``namespace`` tools (Codex's ``multi_agent_v1``) are flattened: their function/custom tools keep their own names and
  are listed in ``context["namespaced"]`` so calls come back with ``namespace``.
- a client-executed ``tool_search`` tool is a function named ``tool_search`` (``context["tool_search"]``); the tools
  its ``tool_search_output`` items loaded earlier in the input are added after the declared ones.
- hosted tools (``web_search``, ``file_search``, ``mcp``, server-side ``tool_search``...) are dropped.
"""

from __future__ import annotations

import json
from typing import Any

from polar_cli.errors import ProtocolError

TOOL_SEARCH = "tool_search"  # the function name a client-executed ``tool_search`` tool gets


def custom_arguments(text: str) -> str:
    """The chat ``arguments`` string standing for a custom tool's freeform input."""
    return json.dumps({"input": text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The freeform input back out of the model's arguments for a custom tool (lenient: models stray)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments  # the model wrote the raw input instead of JSON: that IS the input
    if isinstance(parsed, dict):
        if isinstance(parsed.get("input"), str):
            return str(parsed["input"])
        strings = [v for v in parsed.values() if isinstance(v, str)]
        if len(parsed) == 1 and strings:
            return strings[0]
    elif isinstance(parsed, str):
        return parsed
    return arguments


def discovered_tools(items: Any) -> list[Any]:
    """Tools that a client-side ``tool_search`` loaded earlier in the conversation (Codex's deferred tools)."""
    if not isinstance(items, list):
        return []
    found: list[Any] = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "tool_search_output" and isinstance(item.get("tools"), list):
            found.extend(item["tools"])
    return found


def chat_tools(tools: Any, discovered: list[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    context: dict[str, Any] = {"custom_tools": {}, "namespaced": {}, "tool_search": False}
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ProtocolError("'tools' must be a list")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(tool: dict[str, Any], namespace: str | None) -> None:
        kind = tool.get("type")
        if kind == "tool_search" and tool.get("execution") == "client" and TOOL_SEARCH not in seen:
            seen.add(TOOL_SEARCH)  # the client runs the search: to the model it is an ordinary function
            out.append(_function_tool({**tool, "name": TOOL_SEARCH, "strict": None}))
            context["tool_search"] = True
            return
        if kind not in ("function", "custom"):
            return  # hosted tools (web_search, file_search, ...) run on OpenAI's side: nothing a local model can call
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"a {kind} tool needs a string 'name'")
        if name in seen:
            return  # a namespaced tool may not shadow a top-level one: first definition wins
        seen.add(name)
        if kind == "function":
            out.append(_function_tool(tool))
        else:
            out.append(_custom_tool(tool))
            context["custom_tools"][name] = {"format": tool.get("format")}
        if namespace is not None:
            context["namespaced"][name] = namespace

    for tool in [*tools, *discovered]:
        if not isinstance(tool, dict):
            raise ProtocolError("each tool must be an object")
        if tool.get("type") == "namespace":
            inner = tool.get("tools")
            if isinstance(inner, list) and isinstance(tool.get("name"), str):
                for sub in inner:
                    if isinstance(sub, dict):
                        add(sub, tool["name"])
        else:
            add(tool, None)
    return out, context


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    parameters = tool.get("parameters")
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = parameters
    if tool.get("strict") is True:
        function["strict"] = True
    return {"type": "function", "function": function}


def _custom_tool(tool: dict[str, Any]) -> dict[str, Any]:
    description = tool.get("description") or ""
    hint = "This tool takes freeform text: put the whole input in the `input` string."
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and fmt.get("definition"):
        syntax = fmt.get("syntax") or "lark"
        hint += f" The input must match this {syntax} grammar:\n```\n{fmt['definition']}\n```"
    function = {
        "name": tool["name"],
        "description": f"{description}\n\n{hint}" if description else hint,
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The freeform input for this tool."}},
            "required": ["input"],
            "additionalProperties": False,
        },
    }
    return {"type": "function", "function": function}


def tool_choice(choice: Any) -> str | dict[str, Any] | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom") and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
        if kind == "allowed_tools":
            # chat has no allow-list: keep the mode, every tool stays callable
            return "required" if choice.get("mode") == "required" else "auto"
        return "auto"  # a hosted tool (web_search, ...) was forced: none exists here
    raise ProtocolError("'tool_choice' must be 'auto', 'none', 'required' or an object")


def response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        schema.setdefault("name", "response")
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None
