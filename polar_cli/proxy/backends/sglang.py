"""The SGLang backend: ``return_prompt_token_ids`` + ``return_meta_info`` (and newer ``return_token_ids``).

Weight updates use SGLang's own routes (docs "sglang_for_rl"; not run here: SGLang has no CPU build to test against):
``POST /pause_generation {"mode": "retract"}``, ``POST /continue_generation`` and ``POST /update_weights_from_disk
{"model_path"}`` → ``{"success", "message", "num_paused_requests"}``.
"""

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
    reloads_weights = True

    async def pause_generation(self, timeout_s: float) -> bool:
        """``POST /pause_generation {"mode": "retract"}``: the scheduler stops and its running requests go back to the
        waiting queue, to be recomputed under the new weights after ``/continue_generation``. Not ``in_place``: that
        mode keeps the KV cache of the old weights, and the cache flush of a weight update fails while it holds
        requests. False on a server without the route (404)."""
        return await self.control_if_served("/pause_generation", {"mode": "retract"}, timeout_s, what="a pause")

    async def resume_generation(self, timeout_s: float) -> None:
        await self.control_if_served("/continue_generation", {}, timeout_s, what="continuing generation")

    async def reload_weights(self, path: str, timeout_s: float) -> None:
        """``POST /update_weights_from_disk {"model_path": path}`` (it flushes the cache itself); BackendError with the
        server's message when it answers ``success: false``."""
        what = f"loading weights from {path}"
        answer = await self.control("/update_weights_from_disk", {"model_path": path}, timeout_s, what=what)
        if not isinstance(answer, dict) or answer.get("success") is not True:
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise BackendError(f"{what} on the SGLang server at {self.config.url} failed: {message}")

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
                f"the SGLang server at {self.config.url} returned no token ids (choices[0].prompt_token_ids / "
                "meta_info.output_token_logprobs): it needs return_prompt_token_ids and return_meta_info (SGLang >= "
                "0.5.13), and SGLang's router strips them (point the backend URL at a worker itself)"
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
