"""OpenAI Chat Completions codec (``POST /v1/chat/completions``): qwen, pi, opencode and the openai SDK speak it.

Decoding is mostly a clean-up (the normalized shape *is* chat): system/developer messages merge into one leading
system message, text-only part lists become strings (as vLLM joins them), assistant history keeps content, tool calls
(arguments as JSON strings) and reasoning. The synthetic stream is: a role chunk, a reasoning chunk, a content chunk,
per tool call a header chunk then an arguments chunk, the finish_reason chunk, a usage chunk when
``stream_options.include_usage``, then ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar

import orjson

from polar_cli.errors import ProtocolError, brief
from polar_cli.models import Provider
from polar_cli.models.chat import SAMPLING_PARAMS, ChatRequest, Generation, StreamDelta, StreamStart
from polar_cli.proxy.codecs.base import Codec, Route, StreamEncoder
from polar_cli.proxy.codecs.common import each_object, tool_objects

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_ERROR_CODES = {401: "invalid_api_key", 404: "not_found", 429: "rate_limit_exceeded"}
_DONE = b"data: [DONE]\n\n"


def text_of(content: Any, where: str) -> str:
    """Text of a string or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                raise ProtocolError(f"{where}: expected text parts, got {brief(part)}")
        return "\n".join(out)
    raise ProtocolError(f"{where}: content must be a string or a list of parts")


def _content(content: Any, where: str) -> Any:
    """Text-only part lists become one string (vLLM joins them with newlines); images stay as parts."""
    if isinstance(content, list):
        if all(isinstance(p, dict) and p.get("type", "text") == "text" for p in content):
            return text_of(content, where)
        for k, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise ProtocolError(f"{where}[{k}]: each content part must be an object with a type")
        return content
    if content is not None and not isinstance(content, str):
        raise ProtocolError(f"{where}: content must be a string, a list of parts or null")
    return content


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ProtocolError(f"{where}: tool_calls must be a list")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ProtocolError(f"{where}[{k}]: a tool call needs function.name")
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = orjson.dumps(args if args is not None else {}).decode()
        out.append(
            {
                "id": call.get("id") or f"call_{k}",
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def normalize_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages cleaned for the backend, system/developer text merged into one leading message."""
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("'messages' must be a non-empty list")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for _, where, msg in each_object(raw, "messages"):
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise ProtocolError(f"{where}.role must be one of {', '.join(sorted(_ROLES))}; got {brief(role)}")
        if role in ("system", "developer"):
            system.append(text_of(msg.get("content"), f"{where}.content"))
            continue
        if role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": _content(msg.get("content"), where)}
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                message["reasoning_content"] = reasoning
            if msg.get("tool_calls"):
                message["tool_calls"] = _tool_calls(msg["tool_calls"], f"{where}.tool_calls")
            elif isinstance(msg.get("function_call"), dict):
                message["tool_calls"] = _tool_calls([{"function": msg["function_call"]}], f"{where}.function_call")
        elif role in ("tool", "function"):
            message = {"role": "tool", "content": text_of(msg.get("content"), f"{where}.content")}
            call_id = msg.get("tool_call_id") or msg.get("name")
            if call_id:
                message["tool_call_id"] = call_id
        else:
            message = {"role": "user", "content": _content(msg.get("content"), f"{where}.content")}
        out.append(message)
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return out


def normalize_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None and isinstance(body.get("functions"), list):
        tools = [{"type": "function", "function": f} for f in body["functions"]]
    out = []
    for k, tool in tool_objects(tools):
        if tool.get("type", "function") != "function":
            continue  # built-in tools of other providers cannot run on a local model
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ProtocolError(f"tools[{k}].function.name is required")
        out.append({"type": "function", "function": fn})
    return out or None  # vLLM rejects an empty tool list


def sampled_logprobs(generation: Generation) -> dict[str, Any] | None:
    """``logprobs.content`` of a JSON answer: each sampled token's logprob (top_logprobs only when streamed)."""
    if generation.response_logprobs is None:
        return None
    tokens = generation.response_tokens or [""] * len(generation.response_logprobs)
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, generation.response_logprobs, strict=True)
        ]
    }


def usage_of(generation: Generation) -> dict[str, int]:
    p, c = generation.prompt_tokens, generation.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class ChatStreamEncoder(StreamEncoder):
    """``chat.completion.chunk`` events: a role chunk, then per piece a reasoning chunk, a content chunk, per new tool
    call a header chunk (id, name, empty arguments) and argument chunks; on close the finish_reason chunk, a usage
    chunk when ``stream_options.include_usage``, then ``[DONE]``."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.include_usage = bool(request.context.get("include_usage"))
        self.want_logprobs = bool(request.context.get("logprobs"))
        self.head: dict[str, Any] = {}
        self.calls: set[int] = set()

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return b"data: " + orjson.dumps({**self.head, "choices": [choice]}) + b"\n\n"

    def open(self, start: StreamStart) -> bytes:
        self.head = {
            "id": start.id or f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": start.created or int(time.time()),
            "model": self.request.model,
        }
        if self.include_usage:
            self.head["usage"] = None
        return self._chunk({"role": "assistant", "content": ""})

    def delta(self, delta: StreamDelta) -> bytes:
        out = []
        logprobs = {"content": delta.logprobs} if self.want_logprobs and delta.logprobs else None
        if delta.reasoning:
            out.append(self._chunk({"reasoning_content": delta.reasoning}, logprobs=logprobs))
            logprobs = None
        if delta.content:
            out.append(self._chunk({"content": delta.content}, logprobs=logprobs))
            logprobs = None
        for fragment in delta.tool_calls:
            index = int(fragment.get("index") or 0)
            fn = fragment.get("function") or {}
            if index not in self.calls:
                self.calls.add(index)
                header = {"name": fn.get("name"), "arguments": ""}
                call = {"index": index, "id": fragment.get("id"), "type": "function", "function": header}
                out.append(self._chunk({"tool_calls": [call]}, logprobs=logprobs))
                logprobs = None
            if fn.get("arguments"):
                call = {"index": index, "function": {"arguments": fn["arguments"]}}
                out.append(self._chunk({"tool_calls": [call]}, logprobs=logprobs))
                logprobs = None
        if logprobs is not None:  # tokens a parser held back: their logprobs still reach the client
            out.append(self._chunk({}, logprobs=logprobs))
        return b"".join(out)

    def close(self, generation: Generation) -> bytes:
        out = [self._chunk({}, generation.finish_reason)]
        if self.include_usage:
            out.append(b"data: " + orjson.dumps({**self.head, "choices": [], "usage": usage_of(generation)}) + b"\n\n")
        out.append(_DONE)
        return b"".join(out)


class OpenAIChatCodec(Codec):
    """Chat Completions ⇄ normalized chat."""

    provider: ClassVar[Provider] = "openai_chat"

    def decode(self, body: dict[str, Any], route: Route) -> ChatRequest:
        if body.get("n") not in (None, 1):
            raise ProtocolError("only n=1 is supported")
        params = {k: body[k] for k in SAMPLING_PARAMS if body.get(k) is not None}
        if "max_tokens" not in params and body.get("max_completion_tokens") is not None:
            params["max_tokens"] = body["max_completion_tokens"]
        tools = normalize_tools(body)
        choice = body.get("tool_choice") if tools else None
        if not tools:
            params.pop("parallel_tool_calls", None)
        options = body.get("stream_options")
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        model = body.get("model")
        return ChatRequest(
            model=model if isinstance(model, str) and model else "default",
            messages=normalize_messages(body.get("messages")),
            tools=tools,
            tool_choice=choice,
            params=params,
            stream=bool(body.get("stream")),
            context={
                "include_usage": include_usage,
                "logprobs": bool(body.get("logprobs")),
                "top_logprobs": body.get("top_logprobs") if isinstance(body.get("top_logprobs"), int) else 0,
            },
        )

    def _message(self, generation: Generation) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": generation.message.get("content")}
        if generation.reasoning:
            message["reasoning_content"] = generation.reasoning
        if generation.tool_calls:
            message["tool_calls"] = generation.tool_calls
        return message

    def _usage(self, generation: Generation) -> dict[str, int]:
        return usage_of(generation)

    def _id(self, generation: Generation) -> str:
        return generation.id or f"chatcmpl-{uuid.uuid4().hex}"

    def encode(self, generation: Generation, request: ChatRequest) -> dict[str, Any]:
        return {
            "id": self._id(generation),
            "object": "chat.completion",
            "created": generation.created or int(time.time()),
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": self._message(generation),
                    "logprobs": sampled_logprobs(generation) if request.context.get("logprobs") else None,
                    "finish_reason": generation.finish_reason,
                }
            ],
            "usage": self._usage(generation),
        }

    def encoder(self, request: ChatRequest) -> ChatStreamEncoder:
        return ChatStreamEncoder(request)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": _ERROR_CODES.get(status)}}

    def stream_error(self, status: int, message: str) -> bytes:
        return b"data: " + orjson.dumps(self.error_body(status, message)) + b"\n\n"
