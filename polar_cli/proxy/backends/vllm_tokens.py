"""vLLM's token-in/token-out routes (vllm 0.32, served with ``--enable-scale-out``; .ci/VLLM_NOTES.md, "Token mode"):

* ``POST /v1/chat/completions/render``: a chat request → the ids the chat route would prompt with, plus the ready
  ``/inference/v1/generate`` request (sampling parameters resolved as the chat route resolves them);
* ``POST /inference/v1/generate``: ids in → sampled ids, logprobs and ``weight_versions`` out;
* ``POST /v1/chat/completions/derender``: the generate answer → the assistant message, through the server's own
  tool-call and reasoning parsers.

Without the flag vLLM answers these routes 403 (with it disabled) or 404 (older versions).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from polar_cli.errors import BackendError
from polar_cli.models.chat import ChatRequest, Generation, Rendered
from polar_cli.proxy.backends.http import assistant_message

if TYPE_CHECKING:
    from polar_cli.proxy.backends.vllm import VllmClient

RENDER = "/v1/chat/completions/render"
GENERATE = "/inference/v1/generate"
DERENDER = "/v1/chat/completions/derender"
FLAG = "--enable-scale-out"


def missing_route(client: VllmClient, route: str, exc: BackendError) -> BackendError:
    """The one-line error for a server without the token-in routes (403: disabled; 404/405: not there)."""
    return BackendError(
        f"the vLLM server at {client.config.url} has no token-in route {route} (HTTP {exc.status}): token mode "
        f"needs it; start the server with {FLAG}",
        status=409,
    )


async def _post(client: VllmClient, route: str, body: dict[str, Any]) -> Any:
    try:
        return await client.request("POST", route, body)
    except BackendError as exc:
        if exc.status in (403, 404, 405):
            raise missing_route(client, route, exc) from exc
        raise


async def render(client: VllmClient, request: ChatRequest, add_generation_prompt: bool) -> Rendered:
    model = await client.served_model()
    body = client.upstream_body(request, model)
    body["add_generation_prompt"] = add_generation_prompt
    data = await _post(client, RENDER, body)
    ids = data.get("token_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list):
        raise BackendError(f"the vLLM server at {client.config.url} answered {RENDER} without token_ids")
    return Rendered(ids=[int(i) for i in ids], upstream=data)


async def check_routes(client: VllmClient, timeout_s: float) -> None:
    """The backend check of token mode: one render and one one-token generate (no retries)."""
    model = await client.served_model()
    probe = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for route, body in ((RENDER, probe), (GENERATE, {"model": model, "token_ids": [0], "sampling_params":
                                                      {"max_tokens": 1}})):  # fmt: skip
        try:
            await client._once("POST", route, body, budget_s=timeout_s)
        except BackendError as exc:
            if exc.status in (403, 404, 405):
                raise missing_route(client, route, exc) from exc
            raise


def _without_stop_token(out: dict[str, Any]) -> dict[str, Any]:
    """The generate answer without the stop token it ended on: vllm 0.32's derender decodes every id, so the end of
    turn would show in the message's text (``Done.<|im_end|>``), which the chat route leaves out."""
    choice = out["choices"][0]
    ids = choice.get("token_ids") or []
    if choice.get("finish_reason") != "stop" or isinstance(choice.get("stop_reason"), str) or not ids:
        return out
    trimmed = dict(choice, token_ids=ids[:-1])
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        trimmed["logprobs"] = dict(logprobs, content=logprobs["content"][:-1])
    return dict(out, choices=[trimmed, *out["choices"][1:]])


async def generate(client: VllmClient, request: ChatRequest) -> Generation:
    """One call on the token route with the request's ``token_prompt``; the answer parsed by the server's own
    parsers (derender)."""
    prompt = request.token_prompt
    assert prompt is not None
    started = time.perf_counter()
    upstream = prompt.upstream
    if upstream is None:  # rendered by someone else (a pool's other replica answers the same): render here
        upstream = (await render(client, request, True)).upstream or {}
    body = dict(upstream)
    params = dict(body.get("sampling_params") or {})
    params["logprobs"] = 0
    params.setdefault("skip_special_tokens", False)
    if request.params.get("max_tokens") is None and isinstance(params.get("max_tokens"), int):
        # the render resolved "as much as fits" for its own rendering; ours may be longer by the splices
        params["max_tokens"] = max(1, params["max_tokens"] - max(0, len(prompt.ids) - prompt.rendered_len))
    body.update(token_ids=prompt.ids, sampling_params=params, stream=False)
    body.pop("request_id", None)
    out = await _post(client, GENERATE, body)
    seconds = time.perf_counter() - started
    try:
        choice = out["choices"][0]
        ids = [int(i) for i in choice["token_ids"]]
        entries = (choice.get("logprobs") or {}).get("content") or []
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendError(f"{GENERATE} answered a malformed body: {type(exc).__name__}: {exc}") from exc
    chat_body = client.upstream_body(request, body.get("model") or await client.served_model())
    chat = await _post(client, DERENDER, {"generate_response": _without_stop_token(out), "chat_request": chat_body})
    try:
        chat_choice = chat["choices"][0]
        message = assistant_message(chat_choice.get("message") or {})
        texts = (chat_choice.get("logprobs") or {}).get("content") or []
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise BackendError(f"{DERENDER} answered a malformed body: {type(exc).__name__}: {exc}") from exc
    logprobs = [float(e["logprob"]) for e in entries] if len(entries) == len(ids) else None
    tokens = [str(e.get("token", "")) for e in texts] if len(texts) == len(ids) else None
    if tokens is None and len(texts) == len(ids) - 1:  # the stop token was left out of the derender
        tokens = [*(str(e.get("token", "")) for e in texts), ""]
    finish = str(chat_choice.get("finish_reason") or choice.get("finish_reason") or "stop")
    if finish == "stop" and message.get("tool_calls"):
        finish = "tool_calls"  # what the chat route says of the same answer
    return Generation(
        id=str(chat.get("id") or out.get("request_id") or ""),
        model=str(out.get("model") or chat.get("model") or ""),
        message=message,
        finish_reason=finish,
        prompt_ids=list(prompt.ids),
        response_ids=ids,
        response_logprobs=logprobs,
        response_tokens=tokens,
        token_source="backend",
        backend=client.name,
        backend_seconds=seconds,
        created=int(out.get("created") or time.time()),
    )
