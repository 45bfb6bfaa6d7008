"""The vLLM backend: exact prompt and sampled token ids plus logprobs from vLLM's chat endpoint (vLLM >= 0.10.2)."""

from __future__ import annotations

from typing import Any

import orjson

from polar_cli.errors import BackendError
from polar_cli.proxy.backends.http import HttpChatClient, base_generation
from polar_cli.proxy.types import ChatRequest, Generation, JsonTokenIds

_SWITCHES = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}


_KEY = b'"prompt_token_ids":'
_SPACE = b" \t\r\n"


def split_prompt_ids(raw: bytes) -> tuple[bytes, JsonTokenIds] | None:
    """Cut the top-level ``prompt_token_ids`` array out of a vLLM answer without parsing its ints.

    A JSON string cannot contain an unescaped ``"`` so ``"prompt_token_ids":`` only matches a key; vLLM has it once.
    Returns the answer with ``[]`` in its place and the ids as JSON text, or None to fall back to a full parse.
    """
    key = raw.find(_KEY)
    if key < 0:
        return None
    start = key + len(_KEY)
    while start < len(raw) and raw[start] in _SPACE:
        start += 1
    if raw[start : start + 1] != b"[":
        return None
    end = raw.find(b"]", start)
    if end < 0:
        return None
    array = raw[start : end + 1]
    if b"\n" in array or b"\r" in array:
        return None  # would break a JSONL line when written verbatim
    return raw[:start] + b"[]" + raw[end + 1 :], JsonTokenIds(array)


class VllmClient(HttpChatClient):
    name = "vllm"

    def load_answer(self, raw: bytes) -> Any:
        split = split_prompt_ids(raw)
        if split is None:
            return orjson.loads(raw)
        rest, ids = split
        data = orjson.loads(rest)
        usage = data.get("usage")
        reported = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        # vLLM's usage.prompt_tokens is len(prompt_token_ids); counting 32K commas costs ~0.1 ms, so count only
        # when the server did not report it
        if isinstance(reported, int):
            ids.length = reported
        data["prompt_token_ids"] = ids
        return data

    def token_switches(self) -> dict[str, Any]:
        return _SWITCHES

    def parse(self, data: dict[str, Any], request: ChatRequest) -> Generation:
        choice = data["choices"][0]
        prompt_ids = data.get("prompt_token_ids")
        response_ids = choice.get("token_ids")
        if prompt_ids is None or response_ids is None:
            raise BackendError(
                "the vLLM server returned no token ids (prompt_token_ids / choices[0].token_ids); "
                "return_token_ids needs vLLM >= 0.10.2"
            )
        logprobs: list[float] | None = None
        tokens: list[str] | None = None
        content = (choice.get("logprobs") or {}).get("content")
        if content is not None and len(content) == len(response_ids):
            logprobs = [float(entry["logprob"]) for entry in content]
            tokens = [str(entry.get("token", "")) for entry in content]
        return base_generation(
            data,
            choice,
            self.name,
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_logprobs=logprobs,
            response_tokens=tokens,
            token_source="backend",
        )
