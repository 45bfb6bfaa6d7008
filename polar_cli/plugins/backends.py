"""Built-in inference backends: vllm, sglang, openai (retokenized) and scripted."""

from __future__ import annotations

from typing import Any, ClassVar

from polar_cli.hookspecs import RegisterBackend, hookimpl
from polar_cli.interfaces import BackendClient, InferenceBackend
from polar_cli.models import validate_model

HTTP_BACKENDS = (
    # name, its client class in polar_cli.proxy (imported when a client is made), description
    ("vllm", "VllmClient", "vLLM OpenAI server: exact prompt/response token ids and logprobs (return_token_ids)"),
    ("sglang", "SglangClient", "SGLang OpenAI server: token ids via return_prompt_token_ids + return_meta_info"),
    (
        "openai",
        "OpenAICompatClient",
        "any OpenAI-compatible server; token ids re-tokenized locally (token_source: retokenized)",
    ),
)


class HttpBackend(InferenceBackend):
    """An inference server reached over HTTP: a ``client_class`` client configured by an ``HttpBackendConfig``."""

    client_class: ClassVar[str] = ""

    def client(self, **config: Any) -> BackendClient:
        from polar_cli import proxy

        client_class: type[proxy.HttpChatClient] = getattr(proxy, self.client_class)
        return client_class(validate_model(proxy.HttpBackendConfig, config, source=f"{self.name} backend"))


def http_backend(name: str, client_class: str, description: str) -> HttpBackend:
    """One built-in HTTP backend, as its own subclass (``name`` and ``description`` are class attributes)."""
    attributes = {"name": name, "description": description, "client_class": client_class, "__module__": __name__}
    return type(f"{name.capitalize()}Backend", (HttpBackend,), attributes)()


class ScriptedBackend(InferenceBackend):
    name = "scripted"
    description = "replays a per-session script of assistant turns with real chat-template token ids (tests, smoke)"

    def client(self, **config: Any) -> BackendClient:
        from polar_cli.proxy import ScriptedClient, ScriptedConfig

        return ScriptedClient(validate_model(ScriptedConfig, config, source="scripted backend"))


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    for backend in (*(http_backend(*row) for row in HTTP_BACKENDS), ScriptedBackend()):
        register(backend)
