"""The SGLang backend: ``return_prompt_token_ids`` + ``return_meta_info`` (and newer ``return_token_ids``)."""

from __future__ import annotations

from typing import Any

from polar_cli.errors import BackendError
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.backends.http import HttpChatClient, base_generation

_SWITCHES = {"logprobs": True, "return_prompt_token_ids": True, "return_meta_info": True}


def output_token_logprobs(meta: dict[str, Any]) -> tuple[list[int], list[float]] | None:
    """Sampled ids and logprobs from ``meta_info``: ``output_token_logprobs`` entries ``[logprob, id, text]`` (or
    dicts), else the parallel ``output_token_logprobs_val`` / ``_idx`` arrays; None when absent."""
    entries = meta.get("output_token_logprobs")
    if entries is not None:
        ids, lps = [], []
        for entry in entries:
            if isinstance(entry, dict):
                token_id, logprob = entry.get("token_id", entry.get("id")), entry.get("logprob")
            else:
                logprob, token_id = entry[0], entry[1]
            if token_id is None:
                raise BackendError(f"malformed SGLang output_token_logprobs entry: {entry!r}")
            ids.append(int(token_id))
            lps.append(float(logprob) if logprob is not None else 0.0)
        return ids, lps
    values, idx = meta.get("output_token_logprobs_val"), meta.get("output_token_logprobs_idx")
    if values is not None and idx is not None and len(values) == len(idx):
        return [int(i) for i in idx], [float(v) for v in values]
    return None


class SglangClient(HttpChatClient):
    name = "sglang"

    def token_switches(self) -> dict[str, Any]:
        return _SWITCHES

    def parse(self, data: dict[str, Any], request: ChatRequest) -> Generation:
        choice = data["choices"][0]
        prompt_ids = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
        meta = choice.get("meta_info") or data.get("meta_info") or {}
        pairs = output_token_logprobs(meta)
        response_ids = choice.get("token_ids") or meta.get("output_ids")
        logprobs: list[float] | None = None
        if pairs is not None:
            if response_ids is None or list(response_ids) == pairs[0]:
                response_ids, logprobs = pairs
            elif len(pairs[1]) == len(response_ids):
                logprobs = pairs[1]
        if prompt_ids is None or response_ids is None:
            raise BackendError(
                "the SGLang server returned no token ids (choices[0].prompt_token_ids / meta_info."
                "output_token_logprobs); it needs return_prompt_token_ids and return_meta_info (SGLang >= 0.5.13)"
            )
        return base_generation(
            data,
            choice,
            self.name,
            prompt_ids=list(prompt_ids),
            response_ids=list(response_ids),
            response_logprobs=logprobs,
            token_source="backend",
        )
