"""The openai backend: any OpenAI-compatible server without token ids; ids are recomputed locally.

The prompt and the answer are rendered with the model's HF tokenizer and chat template; such records carry
``token_source: "retokenized"`` and builders refuse them for RL unless explicitly allowed.
"""

from __future__ import annotations

from typing import Any

from polar_cli.errors import ConfigError
from polar_cli.models.chat import ChatRequest, Generation
from polar_cli.proxy.backends.http import HttpBackendConfig, HttpChatClient, base_generation
from polar_cli.proxy.budget import text_chars
from polar_cli.proxy.render import ChatRenderer, load_tokenizer, off_loop


class OpenAICompatClient(HttpChatClient):
    name = "openai"

    def __init__(self, config: HttpBackendConfig) -> None:
        if not config.tokenizer:
            raise ConfigError("the openai backend recomputes token ids locally: give it the model's tokenizer")
        super().__init__(config)
        self.renderer = ChatRenderer(load_tokenizer(config.tokenizer))

    def token_switches(self) -> dict[str, Any]:
        return {"logprobs": True}

    def parse(self, data: dict[str, Any], request: ChatRequest) -> Generation:
        choice = data["choices"][0]
        content = (choice.get("logprobs") or {}).get("content")
        generation = base_generation(
            data, choice, self.name, prompt_ids=[], response_ids=[], token_source="retokenized"
        )
        generation.response_logprobs = [float(e["logprob"]) for e in content] if content else None
        return generation

    def _retokenize(self, request: ChatRequest, generation: Generation) -> None:
        generation.prompt_ids = self.renderer.prompt_ids(request.messages, request.tools, request.prompt_budget)
        generation.response_ids = self.renderer.turn_ids(request.messages, request.tools, generation.message)
        # server logprobs only stay when they line up one-to-one with our ids
        if generation.response_logprobs is not None and len(generation.response_logprobs) != len(
            generation.response_ids
        ):
            generation.response_logprobs = None

    async def generate(self, request: ChatRequest, *, session_id: str) -> Generation:
        generation = await super().generate(request, session_id=session_id)
        size = text_chars(request.messages, request.tools) + text_chars([generation.message])
        await off_loop(size, self._retokenize, request, generation)
        return generation

    async def count_tokens(self, request: ChatRequest) -> int:
        size = text_chars(request.messages, request.tools)
        ids = await off_loop(size, self.renderer.prompt_ids, request.messages, request.tools, request.prompt_budget)
        return len(ids)
