"""Google Gemini (generativelanguage v1beta) request → normalized chat request (decode half of the Google codec).

- ``systemInstruction`` (a string, a Content ``{parts}`` or a list of parts) → ONE leading system message.
- ``contents``: role ``user`` (or ``function``/``tool``) / ``model``. User parts: ``text``; ``inlineData`` and
  ``fileData`` images → chat ``image_url`` parts (other media are dropped); ``functionResponse`` → ``tool`` messages
  (the ``response`` object as compact JSON), emitted before the rest of that turn. Model parts: ``text``; thought
  parts ``{text, thought: true}`` → ``reasoning_content``; ``functionCall{name, args, id?}`` → ``tool_calls``.
- A ``thoughtSignature`` made by this proxy carries the reasoning text (see ``common.seal_thought``); when a client
  dropped the thought parts but kept the signature (gemini CLI does), the reasoning is restored from it. Foreign
  signatures (e.g. gemini CLI's ``skip_thought_signature_validator``) are ignored.
- Call ids: a ``functionCall`` without an ``id`` gets a deterministic one (``call_<turn>_<k>``); a
  ``functionResponse`` is matched by its ``id``, else to the oldest unanswered call of the same name, else the
  oldest unanswered call, else gets a deterministic id of its own.
- ``tools[].functionDeclarations`` with ``parameters`` (OpenAPI subset, upper-case types: converted to JSON schema) or
  ``parametersJsonSchema`` (kept) → function tools; other tools (googleSearch, codeExecution, ...) are dropped.
  ``toolConfig.functionCallingConfig.mode`` AUTO/ANY/NONE/VALIDATED → auto/required/none/auto; ANY with exactly
  one ``allowedFunctionNames`` forces that function.
- ``generationConfig``: temperature, topP, topK, maxOutputTokens, stopSequences, seed, presencePenalty,
  frequencyPenalty; ``responseMimeType: application/json`` → ``response_format`` (``json_schema`` when a
  ``responseSchema``/``responseJsonSchema`` is given, else ``json_object``); ``candidateCount`` > 1 is a 400 (the
  proxy makes one backend call per request); ``thinkingConfig`` and unknown fields are ignored.
Field names are accepted in camelCase (what the SDKs and the CLI send) and snake_case (which the API also accepts).
"""

from __future__ import annotations

from typing import Any

import orjson

from polar_cli.errors import ProtocolError, brief
from polar_cli.models.chat import ChatRequest
from polar_cli.proxy.codecs.common import (
    data_url_part,
    dump_arguments,
    each_object,
    function_tool,
    tool_objects,
    unseal_thought,
    url_part,
    user_content,
)

_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto", "MODE_UNSPECIFIED": None}
_GENERATION_PARAMS = (
    ("temperature", "temperature", "temperature"),
    ("topP", "top_p", "top_p"),
    ("topK", "top_k", "top_k"),
    ("maxOutputTokens", "max_output_tokens", "max_tokens"),
    ("seed", "seed", "seed"),
    ("presencePenalty", "presence_penalty", "presence_penalty"),
    ("frequencyPenalty", "frequency_penalty", "frequency_penalty"),
)
_DROP_SCHEMA_KEYS = frozenset({"propertyOrdering", "property_ordering"})
_SNAKE = {
    "anyOf": "any_of",
    "maxItems": "max_items",
    "minItems": "min_items",
    "minLength": "min_length",
    "maxLength": "max_length",
    "maxProperties": "max_properties",
    "minProperties": "min_properties",
}
_CAMEL_SCHEMA = {v: k for k, v in _SNAKE.items()}


def field(obj: dict[str, Any], camel: str, snake: str | None = None) -> Any:
    """``obj[camel]``, falling back to the snake_case spelling."""
    value = obj.get(camel)
    if value is None and snake is not None:
        value = obj.get(snake)
    return value


def openapi_to_json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI-subset Schema (``type: "STRING"``, ``nullable``) as lower-case JSON schema, recursively."""
    if isinstance(schema, list):
        return [openapi_to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for raw_key, value in schema.items():
        if raw_key in _DROP_SCHEMA_KEYS or value is None:
            continue
        key = _CAMEL_SCHEMA.get(str(raw_key), str(raw_key))
        if key == "type" and isinstance(value, str):
            out["type"] = "object" if value.upper() == "TYPE_UNSPECIFIED" else value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: openapi_to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "not", "additionalProperties"):
            out[key] = openapi_to_json_schema(value)
        else:
            out[key] = value
    if out.pop("nullable", False) is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _part_texts(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    parts = value.get("parts") if isinstance(value, dict) else value
    if isinstance(parts, dict):
        parts = [parts]
    if not isinstance(parts, list):
        raise ProtocolError(f"{where} must be a string, a Content object or a list of parts")
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]


def _image(part: dict[str, Any], where: str) -> dict[str, Any] | None:
    inline = field(part, "inlineData", "inline_data")
    if isinstance(inline, dict):
        mime, data = field(inline, "mimeType", "mime_type"), inline.get("data")
        if not isinstance(mime, str) or not isinstance(data, str):
            raise ProtocolError(f"{where}.inlineData needs mimeType and data strings")
        return data_url_part(mime, data) if mime.startswith("image/") else None
    file_data = field(part, "fileData", "file_data")
    if isinstance(file_data, dict):
        mime, uri = field(file_data, "mimeType", "mime_type"), field(file_data, "fileUri", "file_uri")
        if isinstance(uri, str) and (not isinstance(mime, str) or mime.startswith("image/")):
            return url_part(uri)
    return None  # audio, video, pdf...: nothing a text chat backend can take


class _Calls:
    """Pending function calls, so that responses without ids find their call."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []  # (id, name), oldest first

    def add(self, call_id: str, name: str) -> None:
        self.pending.append((call_id, name))

    def answer(self, call_id: Any, name: Any, fallback: str) -> str:
        if isinstance(call_id, str) and call_id:
            self.pending = [p for p in self.pending if p[0] != call_id]
            return call_id
        for k, (pending_id, pending_name) in enumerate(self.pending):
            if pending_name == name:
                del self.pending[k]
                return pending_id
        if self.pending:
            return self.pending.pop(0)[0]
        return fallback


def _user_turn(parts: list[Any], where: str, turn: int, calls: _Calls) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for k, at, part in each_object(parts, f"{where}.parts"):
        response = field(part, "functionResponse", "function_response")
        if isinstance(response, dict):
            name = response.get("name")
            call_id = calls.answer(response.get("id"), name, f"call_{turn}_{k}")
            payload = response.get("response")
            tools.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": orjson.dumps(payload if payload is not None else {}).decode(),
                }
            )
        elif isinstance(part.get("text"), str):
            if not part.get("thought"):
                content.append({"type": "text", "text": part["text"]})
        else:
            image = _image(part, at)
            if image is not None:
                content.append(image)
    if content:
        tools.append({"role": "user", "content": user_content(content)})
    return tools


def _model_turn(parts: list[Any], where: str, turn: int, calls: _Calls) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    sealed: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for k, at, part in each_object(parts, f"{where}.parts"):
        restored = unseal_thought(field(part, "thoughtSignature", "thought_signature"))
        if restored is not None:
            sealed.append(restored)
        call = field(part, "functionCall", "function_call")
        if isinstance(call, dict):
            name = call.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError(f"{at}.functionCall.name is required")
            given = call.get("id")
            call_id = given if isinstance(given, str) and given else f"call_{turn}_{k}"
            calls.add(call_id, name)
            tool_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": dump_arguments(call.get("args") or {})},
                }
            )
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else texts).append(part["text"])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    reasoning = "".join(thoughts) or "".join(sealed)
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def decode_contents(raw: Any, *, allow_empty: bool = False) -> list[dict[str, Any]]:
    if raw is None and allow_empty:
        return []
    if not isinstance(raw, list) or (not raw and not allow_empty):
        raise ProtocolError("'contents' must be a non-empty list")
    out: list[dict[str, Any]] = []
    calls = _Calls()
    for i, where, content in each_object(raw, "contents"):
        parts = content.get("parts") or []
        if not isinstance(parts, list):
            raise ProtocolError(f"{where}.parts must be a list")
        role = content.get("role") or "user"
        if role == "model":
            out.append(_model_turn(parts, where, i, calls))
        elif role in ("user", "function", "tool"):
            out.extend(_user_turn(parts, where, i, calls))
        else:
            raise ProtocolError(f"{where}.role must be 'user' or 'model'; got {brief(role)}")
    return out


def decode_tools(raw: Any) -> list[dict[str, Any]] | None:
    out = []
    for k, tool in tool_objects(raw):
        declarations = field(tool, "functionDeclarations", "function_declarations") or []
        if not isinstance(declarations, list):
            raise ProtocolError(f"tools[{k}].functionDeclarations must be a list")
        for j, decl in enumerate(declarations):
            if not isinstance(decl, dict) or not isinstance(decl.get("name"), str) or not decl["name"]:
                raise ProtocolError(f"tools[{k}].functionDeclarations[{j}].name is required")
            schema = field(decl, "parametersJsonSchema", "parameters_json_schema")
            if schema is None and decl.get("parameters") is not None:
                schema = openapi_to_json_schema(decl["parameters"])
            parameters = schema if isinstance(schema, dict) else {"type": "object", "properties": {}}
            out.append(function_tool(decl["name"], decl.get("description"), parameters))
    return out or None  # vLLM rejects an empty tool list


def decode_tool_choice(raw: Any) -> str | dict[str, Any] | None:
    config = field(raw, "functionCallingConfig", "function_calling_config") if isinstance(raw, dict) else None
    if not isinstance(config, dict):
        return None
    mode = config.get("mode")
    if mode is not None and (not isinstance(mode, str) or mode not in _MODES):
        choices = "AUTO, ANY, NONE or VALIDATED"
        raise ProtocolError(f"toolConfig.functionCallingConfig.mode must be {choices}; got {brief(mode)}")
    names = field(config, "allowedFunctionNames", "allowed_function_names")
    if mode == "ANY" and isinstance(names, list) and len(names) == 1 and isinstance(names[0], str):
        return {"type": "function", "function": {"name": names[0]}}
    return _MODES.get(mode) if mode is not None else None


def decode_generation_config(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ProtocolError("'generationConfig' must be an object")
    count = field(config, "candidateCount", "candidate_count")
    if count is not None and count != 1:
        raise ProtocolError("generationConfig.candidateCount must be 1: this proxy generates one candidate")
    params: dict[str, Any] = {}
    for camel, snake, name in _GENERATION_PARAMS:
        value = field(config, camel, snake)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ProtocolError(f"generationConfig.{camel} must be a number")
            params[name] = value
    stop = field(config, "stopSequences", "stop_sequences")
    if stop:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ProtocolError("generationConfig.stopSequences must be a list of strings")
        params["stop"] = stop
    mime = field(config, "responseMimeType", "response_mime_type")
    if mime == "application/json":
        schema = field(config, "responseJsonSchema", "response_json_schema")
        if schema is None and field(config, "responseSchema", "response_schema") is not None:
            schema = openapi_to_json_schema(field(config, "responseSchema", "response_schema"))
        if isinstance(schema, dict):
            params["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
        else:
            params["response_format"] = {"type": "json_object"}
    return params


def decode_request(body: dict[str, Any], model: str, *, stream: bool, count_only: bool = False) -> ChatRequest:
    messages = decode_contents(body.get("contents"), allow_empty=count_only)
    system = "\n".join(_part_texts(field(body, "systemInstruction", "system_instruction"), "systemInstruction"))
    if system:
        messages.insert(0, {"role": "system", "content": system})
    if not messages and not count_only:
        raise ProtocolError("'contents' must not be empty")
    tools = decode_tools(body.get("tools"))
    choice = decode_tool_choice(field(body, "toolConfig", "tool_config")) if tools else None
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        params=decode_generation_config(field(body, "generationConfig", "generation_config")),
        stream=stream,
    )
