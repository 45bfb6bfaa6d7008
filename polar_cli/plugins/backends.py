"""Built-in inference backends: vllm, sglang, openai (retokenized) and scripted."""

from __future__ import annotations

from typing import Any

from polar_cli.hookspecs import RegisterBackend, hookimpl
from polar_cli.interfaces import BackendClient, InferenceBackend
from polar_cli.models import validate_model


class VllmBackend(InferenceBackend):
    name = "vllm"
    description = "vLLM OpenAI server: exact prompt/response token ids and logprobs (return_token_ids)"

    def client(self, **config: Any) -> BackendClient:
        from polar_cli.proxy.backends.http import HttpBackendConfig
        from polar_cli.proxy.backends.vllm import VllmClient

        return VllmClient(validate_model(HttpBackendConfig, config, source="vllm backend"))


class SglangBackend(InferenceBackend):
    name = "sglang"
    description = "SGLang OpenAI server: token ids via return_prompt_token_ids + return_meta_info"

    def client(self, **config: Any) -> BackendClient:
        from polar_cli.proxy.backends.http import HttpBackendConfig
        from polar_cli.proxy.backends.sglang import SglangClient

        return SglangClient(validate_model(HttpBackendConfig, config, source="sglang backend"))


class OpenAIBackend(InferenceBackend):
    name = "openai"
    description = "any OpenAI-compatible server; token ids re-tokenized locally (token_source: retokenized)"

    def client(self, **config: Any) -> BackendClient:
        from polar_cli.proxy.backends.http import HttpBackendConfig
        from polar_cli.proxy.backends.openai import OpenAICompatClient

        return OpenAICompatClient(validate_model(HttpBackendConfig, config, source="openai backend"))


class ScriptedBackend(InferenceBackend):
    name = "scripted"
    description = "replays a per-session script of assistant turns with real chat-template token ids (tests, smoke)"

    def client(self, **config: Any) -> BackendClient:
        from polar_cli.proxy.backends.scripted import ScriptedClient, ScriptedConfig

        return ScriptedClient(validate_model(ScriptedConfig, config, source="scripted backend"))


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    for backend in (VllmBackend(), SglangBackend(), OpenAIBackend(), ScriptedBackend()):
        register(backend)
