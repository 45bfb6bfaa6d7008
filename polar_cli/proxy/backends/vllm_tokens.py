"""vLLM's token-in/token-out routes (vllm 0.32, served with ``--enable-scale-out``; .ci/VLLM_NOTES.md, "Token mode"):

* ``POST /v1/chat/completions/render``: a chat request → the ids the chat route would prompt with, plus the ready
  ``/inference/v1/generate`` request (sampling parameters resolved as the chat route resolves them);
* ``POST /inference/v1/generate``: ids in → sampled ids, logprobs and ``weight_versions`` out;
* ``POST /v1/chat/completions/derender``: the generate answer → the assistant message, through the server's own
  tool-call and reasoning parsers.

Without the flag vLLM answers these routes 403 (with it disabled) or 404 (older versions).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from polar_cli.aio import cancel_and_wait
from polar_cli.errors import BackendError
from polar_cli.models.chat import INTERRUPTED, ChatRequest, Generation, Rendered
from polar_cli.proxy.backends.http import assistant_message, upstream_error
from polar_cli.proxy.streaming import UpstreamStreamError, sse_chunks

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


def _without_stop_token(choice: dict[str, Any]) -> dict[str, Any]:
    """The answer without the stop token it ended on: vllm 0.32's derender decodes every id, so the end of turn would
    show in the message's text (``Done.<|im_end|>``), which the chat route leaves out."""
    ids = choice.get("token_ids") or []
    if choice.get("finish_reason") != "stop" or isinstance(choice.get("stop_reason"), str) or not ids:
        return choice
    trimmed = dict(choice, token_ids=ids[:-1])
    trimmed["logprobs"] = {"content": choice["logprobs"]["content"][:-1]}
    return trimmed


@dataclass
class _Streamed:
    """What the streamed generate call has sent so far."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    model: str = ""
    request_id: str = ""


async def _read(client: VllmClient, body: dict[str, Any], into: _Streamed) -> None:
    """Stream one generate call into ``into`` (its ids and logprobs as they come)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=client.config.connect_timeout_s,
                                    sock_read=client.config.timeout_s)  # fmt: skip
    try:
        async with client.session.post(client.base + GENERATE, data=orjson.dumps(body), timeout=timeout) as resp:
            if resp.status >= 400:
                exc = upstream_error(client.name, resp.status, await resp.read(), resp.headers.get("Retry-After"))
                raise missing_route(client, GENERATE, exc) if exc.status in (403, 404, 405) else exc
            async for chunk in sse_chunks(resp.content):
                into.model = into.model or str(chunk.get("model") or "")
                into.request_id = into.request_id or str(chunk.get("request_id") or "")
                for choice in chunk.get("choices") or []:
                    ids = [int(i) for i in choice.get("token_ids") or []]
                    entries = (choice.get("logprobs") or {}).get("content") or []
                    if len(entries) != len(ids):
                        raise BackendError(f"{GENERATE} streamed {len(ids)} ids with {len(entries)} logprobs")
                    into.ids += ids
                    into.logprobs += [float(e["logprob"]) for e in entries]
                    if choice.get("finish_reason"):
                        into.finish_reason = str(choice["finish_reason"])
                        into.stop_reason = choice.get("stop_reason")
    except TimeoutError as exc:
        raise BackendError(f"{client.name} backend at {client.base} timed out", status=504, retryable=True) from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, UpstreamStreamError) as exc:
        raise BackendError(f"{client.name} backend at {client.base}: {GENERATE} failed: {exc}", retryable=True
                           ) from exc  # fmt: skip


async def _stream(client: VllmClient, body: dict[str, Any], interrupt: asyncio.Event | None) -> tuple[_Streamed, bool]:
    """The streamed call, stopped (its connection closed, so vLLM aborts it) when ``interrupt`` is set first; says
    whether it was interrupted."""
    got = _Streamed()
    reader = asyncio.ensure_future(_read(client, body, got))
    if interrupt is None:
        await reader
        return got, False
    waiter = asyncio.ensure_future(interrupt.wait())
    try:
        await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if reader.done():
        reader.result()
        return got, False
    await cancel_and_wait(reader)
    return got, True


async def generate(client: VllmClient, request: ChatRequest) -> Generation:
    """One call on the token route with the request's ``token_prompt`` (streamed from vLLM, so that an interrupted
    call keeps what it sampled); the whole answer, a resumed call's earlier part included, is parsed by the server's
    own parsers (derender)."""
    prompt = request.token_prompt
    assert prompt is not None
    started = time.perf_counter()
    upstream = prompt.upstream
    if upstream is None:  # rendered by someone else (a pool's other replica answers the same): render here
        upstream = (await render(client, request, True)).upstream or {}
    before = prompt.sampled.ids if prompt.sampled is not None else []
    body = dict(upstream)
    params = dict(body.get("sampling_params") or {})
    params["logprobs"] = 0
    params.setdefault("skip_special_tokens", False)
    token_ids = [*prompt.ids, *before]
    if isinstance(params.get("max_tokens"), int):
        if request.params.get("max_tokens") is None:
            # the render resolved "as much as fits" for its own rendering; ours may be longer by the splices
            params["max_tokens"] -= max(0, len(prompt.ids) - prompt.rendered_len)
        params["max_tokens"] = max(1, params["max_tokens"] - len(before))
    body.update(token_ids=token_ids, sampling_params=params, stream=True)
    body.pop("request_id", None)
    got, interrupted = await _stream(client, body, prompt.interrupt)
    seconds = time.perf_counter() - started
    if interrupted:
        return Generation(id=got.request_id, model=got.model, message={"role": "assistant", "content": None},
                          finish_reason=INTERRUPTED, prompt_ids=list(prompt.ids), response_ids=got.ids,
                          response_logprobs=got.logprobs, token_source="backend", backend=client.name,
                          backend_seconds=seconds)  # fmt: skip
    earlier = prompt.sampled.logprobs if prompt.sampled is not None else []
    ids, logprobs = [*before, *got.ids], [*earlier, *got.logprobs]
    finish = got.finish_reason or "stop"
    choice = {"index": 0, "finish_reason": finish, "stop_reason": got.stop_reason, "token_ids": ids,
              "logprobs": {"content": [{"token_id": i, "logprob": lp} for i, lp in zip(ids, logprobs, strict=True)]}}
    answer = {"request_id": got.request_id or "polar", "model": got.model or None,
              "choices": [_without_stop_token(choice)]}  # fmt: skip
    chat_body = client.upstream_body(request, body.get("model") or await client.served_model())
    chat = await _post(client, DERENDER, {"generate_response": answer, "chat_request": chat_body})
    try:
        chat_choice = chat["choices"][0]
        message = assistant_message(chat_choice.get("message") or {})
        texts = (chat_choice.get("logprobs") or {}).get("content") or []
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise BackendError(f"{DERENDER} answered a malformed body: {type(exc).__name__}: {exc}") from exc
    tokens = [str(e.get("token", "")) for e in texts]
    tokens += [""] * (len(ids) - len(tokens))  # the stop token the derender was not given
    if finish == "stop" and message.get("tool_calls"):
        finish = "tool_calls"  # what the chat route says of the same answer
    return Generation(
        id=str(chat.get("id") or got.request_id or ""),
        model=str(got.model or chat.get("model") or ""),
        message=message,
        finish_reason=finish,
        prompt_ids=list(prompt.ids),
        response_ids=ids,
        response_logprobs=logprobs,
        response_tokens=tokens[: len(ids)],
        token_source="backend",
        backend=client.name,
        backend_seconds=seconds,
        created=int(time.time()),
    )
