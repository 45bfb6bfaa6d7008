"""One proxied model call, as captured by the gateway."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar_cli.models.inference import LogprobsMode, VersionSpan

Provider = Literal["anthropic", "openai_chat", "openai_responses", "google"]
TokenSource = Literal["backend", "retokenized"]
TokenMode = Literal["messages", "tokens"]
"""How the proxy built a call's prompt: ``messages`` (the server rendered the harness's messages with its chat
template) or ``tokens`` (the proxy built the prompt as ids: earlier assistant turns spliced in as the ids they were
sampled as, the rest rendered; docs/builders.md, "Token mode")."""
PromptSpanSource = Literal["spliced", "rendered"]
ABORTED = "abort"
"""``finish_reason`` of a call whose client left mid-stream: the proxy stopped the backend and recorded the partial
answer (``metadata.delivery == "aborted"``). It is kept for the record, never trained on: builders drop it."""


class PromptSpan(BaseModel):
    """A run ``[start, end)`` of a tokens-mode prompt: ``spliced`` (an earlier completion's exact sampled ids,
    ``completion_id`` naming it) or ``rendered`` (the chat template's tokens for messages no model sampled)."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    source: PromptSpanSource
    completion_id: str | None = Field(default=None, description="spliced: the completion whose sampled ids these are")
    edited: bool = Field(
        default=False,
        description="spliced: the harness echoed this turn back changed (normalized arguments, edited text); the "
        "model saw what it sampled, the harness's own copy differed",
    )


class Completion(BaseModel):
    """A generation call: what the harness sent, what the policy sampled, token for token.

    ``token_source`` says how the ids were obtained: ``backend`` (returned by the inference server, exact)
    or ``retokenized`` (computed locally from text; never silently used for RL).
    """

    model_config = ConfigDict(extra="forbid")

    completion_id: str
    session_id: str
    index: int = Field(ge=0, description="position of this call within its session")
    provider: Provider
    model: str
    request: dict[str, Any] = Field(description="the provider request exactly as the harness sent it")
    request_messages: list[dict[str, Any]] = Field(description="normalized OpenAI chat messages")
    request_tools: list[dict[str, Any]] | None = None
    request_params: dict[str, Any] = Field(default_factory=dict, description="sampling params sent upstream")
    response_message: dict[str, Any] = Field(description="the assistant message, OpenAI chat shape")
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None = None
    response_tokens: list[str] | None = None
    finish_reason: str | None = None
    token_source: TokenSource = "backend"
    backend: str | None = None
    started_at: float
    finished_at: float
    backend_seconds: float | None = None
    policy_version: int | None = Field(
        default=None, description="the policy version it was sampled under (the first span's when it crossed one)"
    )
    version_spans: list[VersionSpan] | None = Field(
        default=None, description="only when the call crossed a weight update: which tokens came from which version"
    )
    replica: str | None = Field(default=None, description="the inference server that answered")
    logprobs_mode: LogprobsMode | None = Field(
        default=None, description="raw: the model's distribution; processed: the one sampled from (None: unknown)"
    )
    token_mode: TokenMode = Field(default="messages", description="how the prompt was built (see TokenMode)")
    prompt_spans: list[PromptSpan] | None = Field(
        default=None, description="tokens mode: which runs of prompt_ids were spliced and which rendered, in order"
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aligned(self) -> Completion:
        n = len(self.response_ids)
        if self.response_logprobs is not None and len(self.response_logprobs) != n:
            raise ValueError(f"response_logprobs has {len(self.response_logprobs)} entries for {n} response_ids")
        if self.response_tokens is not None and len(self.response_tokens) != n:
            raise ValueError(f"response_tokens has {len(self.response_tokens)} entries for {n} response_ids")
        return self
