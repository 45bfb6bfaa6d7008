"""Pass-through streaming against a fake streaming vLLM (tests/proxy/upstream.py): the client gets the upstream's
pieces as they come, the journal gets the same completion a non-streaming call records, upstream failures mid-stream
are the provider's error event, and a client that leaves aborts the upstream and leaves an ``abort`` completion."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types
from hypothesis import given
from hypothesis import strategies as st

from polar_cli.builders import build_trajectory
from polar_cli.models import Completion
from polar_cli.models.chat import ChatRequest, Generation, JsonTokenIds
from polar_cli.proxy.backends.scripted import ScriptedClient, stream_chunks
from polar_cli.proxy.capture import check_generation
from polar_cli.proxy.codecs import get_codec
from polar_cli.proxy.streaming import StreamAssembler, sse_chunks
from polar_cli.proxy.token_json import loads_keeping_prompt_ids

from .conftest import LoopThread, ProxySession, RunningProxy, closing
from .upstream import Upstream, vllm_chunks

FAST_RETRY = {"attempts": 3, "base_delay_s": 0.001, "max_delay_s": 0.002}
TOKEN_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "response_tokens",
    "response_message",
    "finish_reason",
    "token_source",
    "backend",
    "model",
)


@pytest.fixture
def upstream(loop_thread: LoopThread) -> Upstream:
    return Upstream(loop_thread)


def _proxy(start: Callable[..., RunningProxy], upstream: Upstream, **extra: Any) -> RunningProxy:
    return start(backend="vllm", backend_url=upstream.url, model="served-model", retry=FAST_RETRY, **extra)


def _client(session: ProxySession) -> openai.OpenAI:
    return closing(openai.OpenAI(base_url=session.openai_base, api_key=session.api_key, max_retries=0))


def _wait_for_completions(session: ProxySession, n: int) -> list[dict[str, Any]]:
    for _ in range(500):
        found = session.completions()
        if len(found) >= n:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no {n} completions recorded")


def test_passthrough_streams_pieces_and_records_what_a_plain_call_records(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    client = _client(session)
    messages: Any = [{"role": "user", "content": "hello"}]
    stream = client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["echo:", " hello"]  # the upstream's pieces, not one replayed blob
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    plain = client.chat.completions.create(model="m", messages=messages)
    assert plain.choices[0].message.content == "echo: hello"
    streamed, answered = session.completions()
    for key in TOKEN_FIELDS:
        assert streamed[key] == answered[key], key
    assert streamed["metadata"]["stream"] is True and streamed["metadata"]["delivery"] == "answered"
    assert streamed["response_ids"] == [7, 8, 2] and streamed["response_logprobs"] == [-0.5] * 3


def test_passthrough_returns_logprobs_to_a_client_that_asks(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    stream = _client(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True, logprobs=True
    )
    entries = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [e.logprob for e in entries] == [-0.5] * 3
    plain = _client(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], logprobs=True
    )
    assert plain.choices[0].logprobs is not None and plain.choices[0].logprobs.content is not None
    assert [e.logprob for e in plain.choices[0].logprobs.content] == [-0.5] * 3
    unasked = _client(session).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert unasked.choices[0].logprobs is None


@pytest.mark.parametrize("failure", ["break", "error_chunk"])
def test_an_upstream_failure_mid_stream_is_the_providers_error_event(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream, failure: str
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    upstream.actions.append(failure)
    stream = _client(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError):
        list(stream)
    assert upstream.requests == 1  # bytes had reached the client: never retried behind its back
    assert session.completions() == []


class _Pieces:
    """An aiohttp body's ``iter_any`` that hands out ``raw`` in pieces of the given sizes, in turn."""

    def __init__(self, raw: bytes, sizes: list[int]) -> None:
        self.raw, self.sizes = raw, sizes

    async def iter_any(self) -> Any:
        at, n = 0, 0
        while at < len(self.raw):
            size = self.sizes[n % len(self.sizes)]
            yield self.raw[at : at + size]
            at, n = at + size, n + 1


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


@pytest.mark.parametrize(("tokens", "sizes"), [(32768, [1 << 20]), (32768, [7, 1, 300]), (40, [1])])
def test_vllms_streamed_prompt_ids_are_kept_as_text_and_checked_without_being_parsed(
    tokens: int, sizes: list[int]
) -> None:
    """The first chunk's ~200 KB of prompt ids (32K tokens) cost a millisecond to parse, per stream: they are cut out
    as text, counted and checked as bytes, and journaled verbatim; frames split anywhere reassemble the same."""
    prompt = [(i * 7919) % 150000 for i in range(tokens)]
    chunks = vllm_chunks("echo: hi", prompt)

    async def read() -> list[dict[str, Any]]:
        return [c async for c in sse_chunks(_Pieces(_sse(chunks), sizes), load=loads_keeping_prompt_ids)]

    got = asyncio.run(read())
    ids = got[0]["prompt_token_ids"]
    assert isinstance(ids, JsonTokenIds) and ids.raw == json.dumps(prompt, separators=(",", ":")).encode()
    assert [{k: v for k, v in c.items() if k != "prompt_token_ids"} for c in got] == [
        {k: v for k, v in c.items() if k != "prompt_token_ids"} for c in chunks
    ]
    assembler = StreamAssembler("vllm")
    opened, _ = assembler.feed(got[0])
    assert opened is not None and opened.prompt_tokens == len(prompt)
    for chunk in got[1:]:
        assembler.feed(chunk)
    generation = assembler.generation()
    check_generation(generation)
    assert generation.prompt_ids is ids and ids.length == len(prompt) and ids.checked
    assert ids._list is None  # never parsed into ints


def test_a_frame_of_several_lines_still_yields_its_data_lines() -> None:
    raw = b': keep-alive\n\nevent: chunk\ndata: {"a":1}\r\n\nid: 7\ndata: {"b":2}\n\ndata: [DONE]\n\n'

    async def read() -> list[dict[str, Any]]:
        return [c async for c in sse_chunks(_Pieces(raw, [5, 1]))]

    assert asyncio.run(read()) == [{"a": 1}, {"b": 2}]


@given(
    st.lists(
        st.sampled_from(['data: {"a":1}', 'data:{"b":[1,2]}', 'data: \t{"c":3} \t', ": note", "id: 7"]), max_size=4
    )
    .map("\n".join)
    .filter(lambda frame: "data:" in frame)
    .flatmap(lambda frame: st.tuples(st.just(frame), st.lists(st.integers(1, 9), min_size=1, max_size=5))),
)
def test_frames_end_at_the_first_blank_line_however_the_bytes_are_cut(case: tuple[str, list[int]]) -> None:
    """A frame's lines (single newlines) never end it; the blank line does, also when it is cut between two pieces;
    a data: value is read with or without blanks around it, in a frame of one line or of several."""
    frame, sizes = case
    raw = (frame + "\n\n").encode() * 3 + b"data: [DONE]\n\n"
    expected = [json.loads(line[5:]) for line in frame.split("\n") if line.startswith("data:")] * 3

    async def read() -> list[dict[str, Any]]:
        return [c async for c in sse_chunks(_Pieces(raw, sizes))]

    assert asyncio.run(read()) == expected


@pytest.mark.parametrize("bad", ["not_ints", "miscounted"])
def test_a_stream_with_invalid_prompt_ids_ends_in_an_error_event_and_journals_nothing(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream, bad: str
) -> None:
    """The ids are checked as text at the stream's end: ints only, as many as the server's usage says."""
    session = _proxy(start_proxy, upstream).new_session()
    raw = _sse(vllm_chunks("echo: x", [1, 2, 3]))
    if bad == "not_ints":
        raw = raw.replace(b'"prompt_token_ids":[1,2,3]', b'"prompt_token_ids":[1,"a",3]')
    else:
        raw = raw.replace(b'"prompt_tokens":3', b'"prompt_tokens":4')
    upstream.actions.append(("sse", [raw]))
    stream = _client(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError, match="invalid token data"):
        list(stream)
    assert session.completions() == []
    messages: Any = [{"role": "user", "content": "x"}]
    after = _client(session).chat.completions.create(model="m", messages=messages, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in after if c.choices) == "echo: x"
    [record] = session.completions()
    assert record["prompt_ids"] == [1, 2, 3]


def test_a_stream_cut_before_its_first_chunk_is_retried(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    upstream.actions += ["truncate"]
    stream = _client(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "again"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: again"
    assert upstream.requests == 2 and len(session.completions()) == 1


def test_a_client_that_leaves_aborts_the_upstream_and_leaves_an_abort_completion(
    start_proxy: Callable[..., RunningProxy], loop_thread: LoopThread
) -> None:
    upstream = Upstream(loop_thread, token_delay_s=0.5)

    async def watch() -> None:
        upstream.stream_closed = asyncio.Event()

    loop_thread.run(watch())
    session = _proxy(start_proxy, upstream).new_session()
    with httpx.stream(
        "POST",
        f"{session.openai_base}/chat/completions",
        headers={"Authorization": f"Bearer {session.api_key}"},
        json={"model": "m", "messages": [{"role": "user", "content": "bye"}], "stream": True},
        timeout=30,
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break  # leave after the first piece of text
    (record,) = _wait_for_completions(session, 1)
    assert record["finish_reason"] == "abort" and record["metadata"]["delivery"] == "aborted"
    assert record["response_ids"] and len(record["response_ids"]) < 3

    async def closed() -> None:
        assert upstream.stream_closed is not None
        await asyncio.wait_for(upstream.stream_closed.wait(), 20)

    loop_thread.run(closed())
    assert upstream.streams_finished == 0
    # kept for the record, never trained on: the builders drop it
    trajectory = build_trajectory("per_request", [Completion.model_validate(record)])
    assert trajectory.traces == [] and trajectory.metadata["trainable_tokens"] == 0


def test_a_client_that_leaves_during_the_prefill_stops_the_upstream_request_at_once(
    start_proxy: Callable[..., RunningProxy], loop_thread: LoopThread
) -> None:
    upstream = Upstream(loop_thread, delay_s=120)  # a prefill far longer than the test
    session = _proxy(start_proxy, upstream).new_session()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{session.openai_base}/chat/completions",
            headers={"Authorization": f"Bearer {session.api_key}"},
            json={"model": "m", "messages": [{"role": "user", "content": "bye"}], "stream": True},
            timeout=httpx.Timeout(30, read=0.5),
        )  # the client gives up before the first token and hangs up
    assert upstream.dropped_in_prefill.wait(60), "the upstream request outlived its client"
    assert session.completions() == []  # nothing was sampled: nothing to keep


def test_synthetic_mode_and_backends_without_token_streams_replay_the_whole_answer(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream, stream_mode="synthetic").new_session()
    stream = _client(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert pieces == ["echo: hello"]
    assert session.completions()[0]["metadata"]["stream"] is True


def test_the_synthetic_stream_is_the_incremental_encoder_driven_with_the_whole_answer() -> None:
    codec = get_codec("openai_chat")
    assert codec is not None
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    generation = Generation(
        id="chatcmpl-1",
        model="m",
        message={"role": "assistant", "content": "hi", "reasoning_content": "think", "tool_calls": [call]},
        finish_reason="tool_calls",
        prompt_ids=[1],
        response_ids=[2, 3],
        created=1,
    )
    request = ChatRequest(model="m", messages=[], stream=True, context={"include_usage": True})
    frames = b"".join(codec.stream(generation, request)).decode().split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    kinds = [f[6:60] for f in frames[:-2]]
    assert len(kinds) == 7  # role, reasoning, content, tool header, tool arguments, finish, usage


def test_anthropic_passthrough_streams_text_deltas_and_records_what_a_plain_call_records(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    client = closing(anthropic.Anthropic(base_url=session.anthropic_base, api_key=session.api_key, max_retries=0))
    messages: Any = [{"role": "user", "content": "hello"}]
    with client.messages.stream(model="m", max_tokens=16, messages=messages) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == ["echo:", " hello"]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3 and final.usage.input_tokens == 3
    plain = client.messages.create(model="m", max_tokens=16, messages=messages)
    assert [b.model_dump(exclude={"parsed_output"}) for b in final.content] == [b.model_dump() for b in plain.content]
    assert plain.id == final.id
    streamed, answered = session.completions()
    for key in TOKEN_FIELDS:
        assert streamed[key] == answered[key], key


def test_anthropic_upstream_failure_mid_stream_is_an_error_event(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    upstream.actions.append("break")
    client = closing(anthropic.Anthropic(base_url=session.anthropic_base, api_key=session.api_key, max_retries=0))
    messages: Any = [{"role": "user", "content": "x"}]
    with pytest.raises(anthropic.APIError), client.messages.stream(model="m", max_tokens=16, messages=messages) as s:
        list(s.text_stream)
    assert session.completions() == []


def test_responses_passthrough_streams_text_deltas_with_logprobs_and_records_what_a_plain_call_records(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    client = _client(session)
    events = list(
        client.responses.create(model="m", input="hello", stream=True, include=["message.output_text.logprobs"])
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [e.delta for e in deltas] == ["echo:", " hello"]
    assert [lp.logprob for e in deltas for lp in e.logprobs] == [-0.5, -0.5]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    plain = client.responses.create(model="m", input="hello")
    assert final.output_text == plain.output_text == "echo: hello" and final.id == plain.id
    streamed, answered = session.completions()
    for key in TOKEN_FIELDS:
        assert streamed[key] == answered[key], key


def test_gemini_passthrough_streams_text_and_records_what_a_plain_call_records(
    start_proxy: Callable[..., RunningProxy], upstream: Upstream
) -> None:
    session = _proxy(start_proxy, upstream).new_session()
    options = types.HttpOptions(base_url=session.google_base, retry_options=types.HttpRetryOptions(attempts=1))
    client = genai.Client(api_key=session.api_key, http_options=options)
    try:
        chunks = list(client.models.generate_content_stream(model="m", contents="hello"))
        assert [c.text for c in chunks] == ["echo:", " hello", ""]  # the last frame: finish and usage
        assert chunks[-1].candidates and chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
        assert chunks[-1].usage_metadata and chunks[-1].usage_metadata.candidates_token_count == 3
        plain = client.models.generate_content(model="m", contents="hello")
        assert plain.text == "echo: hello" and plain.response_id == chunks[0].response_id
    finally:
        client.close()
    streamed, answered = session.completions()
    for key in TOKEN_FIELDS:
        assert streamed[key] == answered[key], key


def test_a_backend_without_token_streams_falls_back_to_synthetic_and_says_so_once(
    start_proxy: Callable[..., RunningProxy], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ScriptedClient, "streams_token_ids", False)  # a backend with no token-id stream
    running = start_proxy()
    session = running.new_session(script=[{"content": "one"}, {"content": "two"}])
    client = _client(session)
    with caplog.at_level(logging.INFO, logger="polar.proxy"):
        for expected in ("one", "two"):
            stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
    assert sum("streams are synthetic" in r.getMessage() for r in caplog.records) == 1


SCRIPTED_TURNS: list[dict[str, Any]] = [
    {"content": "The answer is forty-two.", "reasoning_content": "Let me think about it."},
    {
        "content": "Checking.",
        "tool_calls": [
            {"function": {"name": "lookup", "arguments": {"q": "meaning of life"}}},
            {"id": "call_b", "function": {"name": "echo", "arguments": '{"text": "hi"}'}},
        ],
    },
]


def _scripted_pair(session: ProxySession, provider: str, streamed: bool) -> None:
    """One call in ``provider``'s protocol, streamed or not, consumed to its end."""
    messages: Any = [{"role": "user", "content": "hello"}]
    if provider == "openai_chat":
        client = _client(session)
        if streamed:
            list(client.chat.completions.create(model="m", messages=messages, stream=True))
        else:
            client.chat.completions.create(model="m", messages=messages)
    elif provider == "openai_responses":
        client = _client(session)
        if streamed:
            events = list(client.responses.create(model="m", input="hello", stream=True))
            assert events[-1].type == "response.completed"
        else:
            client.responses.create(model="m", input="hello")
    elif provider == "anthropic":
        ant = closing(anthropic.Anthropic(base_url=session.anthropic_base, api_key=session.api_key, max_retries=0))
        if streamed:
            with ant.messages.stream(model="m", max_tokens=64, messages=messages) as stream:
                stream.get_final_message()
        else:
            ant.messages.create(model="m", max_tokens=64, messages=messages)
    else:
        options = types.HttpOptions(base_url=session.google_base, retry_options=types.HttpRetryOptions(attempts=1))
        gem = genai.Client(api_key=session.api_key, http_options=options)
        try:
            if streamed:
                list(gem.models.generate_content_stream(model="m", contents="hello"))
            else:
                gem.models.generate_content(model="m", contents="hello")
        finally:
            gem.close()


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
def test_scripted_passthrough_records_what_a_plain_call_records(
    start_proxy: Callable[..., RunningProxy], provider: str
) -> None:
    running = start_proxy()
    streamed_session = running.new_session(script=SCRIPTED_TURNS)
    plain_session = running.new_session(script=SCRIPTED_TURNS)
    for _ in SCRIPTED_TURNS:
        _scripted_pair(streamed_session, provider, streamed=True)
        _scripted_pair(plain_session, provider, streamed=False)
    streamed, plain = streamed_session.completions(), plain_session.completions()
    assert len(streamed) == len(plain) == 2
    for s_rec, p_rec in zip(streamed, plain, strict=True):
        assert s_rec["metadata"]["stream"] is True and s_rec["metadata"]["delivery"] == "answered"
        for key in TOKEN_FIELDS:
            if key == "response_message" and s_rec[key].get("tool_calls"):
                # generated call ids depend on the session id; everything else is the same
                for call in s_rec[key]["tool_calls"] + p_rec[key]["tool_calls"]:
                    if call["id"] != "call_b":
                        call["id"] = "x"
            assert s_rec[key] == p_rec[key], key
    assert streamed[1]["response_message"]["tool_calls"][0]["function"]["name"] == "lookup"


def test_scripted_chunks_are_pieces_in_vllms_shape_and_reassemble_to_the_generation() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    generation = Generation(
        id="chatcmpl-1",
        model="m",
        message={"role": "assistant", "content": "hello there", "reasoning_content": "think", "tool_calls": [call]},
        finish_reason="tool_calls",
        prompt_ids=[1, 2],
        response_ids=list(range(10, 22)),
        response_logprobs=[-0.1 * k for k in range(12)],
        response_tokens=[f"t{k}" for k in range(12)],
        backend="scripted",
        created=5,
    )
    chunks = stream_chunks(generation)
    assert chunks[0]["prompt_token_ids"] == [1, 2] and chunks[0]["choices"][0]["token_ids"] == []
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    pieces = [c["choices"][0]["delta"] for c in chunks[1:-2]]
    assert len(pieces) == 7  # 2 reasoning, 2 content, call header, 2 argument pieces
    assembler = StreamAssembler("scripted")
    for chunk in chunks:
        assembler.feed(chunk)
    again = assembler.generation()
    for key in ("message", "finish_reason", "prompt_ids", "response_ids", "response_logprobs", "response_tokens"):
        assert getattr(again, key) == getattr(generation, key), key


def test_a_scripted_error_turn_streams_as_an_error_before_any_chunk(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    session = start_proxy().new_session(script=[{"error": {"status": 503, "message": "scripted outage"}}])
    with pytest.raises(openai.APIStatusError) as caught:
        list(
            _client(session).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=True
            )
        )
    assert caught.value.status_code == 503
    assert session.completions() == []


def test_anthropic_passthrough_streams_tool_input_as_partial_json(proxy: RunningProxy) -> None:
    """A call's arguments go out as ``input_json_delta`` pieces as they arrive; arguments that are not a JSON object
    are held and sent whole, normalized as a non-streamed answer has them."""
    calls = [
        {"id": "toolu_a", "function": {"name": "lookup", "arguments": '{"q": "meaning of life", "n": 3}'}},
        {"id": "toolu_b", "function": {"name": "echo", "arguments": "not json"}},
    ]
    session = proxy.new_session(script=[{"tool_calls": calls}])
    ant = closing(anthropic.Anthropic(base_url=session.anthropic_base, api_key=session.api_key, max_retries=0))
    partials: dict[int, list[str]] = {}
    with ant.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "go"}]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partials.setdefault(event.index, []).append(event.delta.partial_json)
        final = stream.get_final_message()
    blocks = [b for b in final.content if b.type == "tool_use"]
    assert [(b.id, b.name, b.input) for b in blocks] == [
        ("toolu_a", "lookup", {"q": "meaning of life", "n": 3}),
        ("toolu_b", "echo", {"arguments": "not json"}),
    ]
    assert len(partials[0]) > 1 and "".join(partials[0]) == '{"q": "meaning of life", "n": 3}'  # streamed
    assert partials[1] == ['{"arguments":"not json"}']  # held, normalized
    assert final.stop_reason == "tool_use"
