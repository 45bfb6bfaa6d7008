"""The prompt budget (``polar_cli.proxy.budget``).

Against a real ``polar proxy`` process (scripted backend): a body of the maximum size (64 MiB) on every protocol,
generation and token counting, is a 4xx in the provider's shape naming the budget, without the proxy's peak RSS
(``/proc/PID/status`` VmHWM) moving more than docs/proxy.md says, and while it is sent the proxy keeps answering
another session. One proxy process serves the module; the bodies are streamed, never held whole by the test. Then
the checks themselves, and a small configured budget on the in-process proxy."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from polar_cli.errors import PromptTooLongError
from polar_cli.proxy.budget import CHARS_PER_TOKEN, DEFAULT_PROMPT_TOKENS, IMAGE_CHARS, PromptBudget, text_chars
from polar_cli.proxy.render import COUNT_CHUNK_CHARS, ChatRenderer, load_tokenizer
from tests.support.proxy_process import start_proxy

from .conftest import RunningProxy
from .test_hardening import assert_error

TOKEN = "budget-test-token"
MAX_BODY = 64 * 1024 * 1024
"""The proxy's default body limit: the largest body it reads."""
PEAK_MULTIPLE = 3
"""docs/proxy.md: one request moves the proxy's peak RSS by at most 3x its body (measured: 2.5x)."""
CHUNK = 1 << 20


@dataclass
class Session:
    api_key: str
    base_urls: dict[str, str]


class ProxyProcess:
    """``polar proxy`` in its own process (scripted backend, demo tokenizer), so its memory can be read."""

    def __init__(self, tokenizer: Path, journal: Path) -> None:
        self.proc, self.url = start_proxy(["--tokenizer", str(tokenizer), "--journal", str(journal),
                                           "--control-token", TOKEN])  # fmt: skip

    def new_session(self, script: list[dict[str, Any]]) -> Session:
        resp = httpx.post(f"{self.url}/sessions", json={"script": script},
                          headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert resp.status_code == 201, resp.text
        data = resp.json()
        return Session(data["api_key"], data["base_urls"])

    def memory_kb(self) -> dict[str, int]:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return {key: int(value.split()[0]) for key, value in re.findall(r"^(VmRSS|VmHWM):\s+(.*)$", text, re.M)}

    def reset_peak(self) -> None:
        """VmHWM back to the current RSS (Linux's ``clear_refs`` 5), so the next peak is one request's."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def proxy_process(demo_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    running = ProxyProcess(demo_tokenizer, tmp_path_factory.mktemp("journal"))
    try:
        yield running
    finally:
        running.close()


NEWLINE = b"\\n"
"""The hostile text: a newline, escaped in JSON."""


@dataclass(frozen=True)
class Case:
    name: str
    provider: str
    path: str
    head: bytes
    tail: bytes


def _text_body(before: dict[str, Any], where: str) -> tuple[bytes, bytes]:
    """A body's JSON cut around the string at ``where`` (a placeholder), where the hostile text goes."""
    text = orjson.dumps(before).decode()
    head, _, tail = text.partition(f'"{where}"')
    return (head + '"').encode(), ('"' + tail).encode()


def _cases() -> list[Case]:
    chat = {"model": "m", "messages": [{"role": "user", "content": "FILL"}]}
    messages = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "FILL"}]}
    gemini = {"contents": [{"role": "user", "parts": [{"text": "FILL"}]}]}
    return [
        Case("chat", "openai", "/chat/completions", *_text_body(chat, "FILL")),
        Case("responses", "openai", "/responses", *_text_body({"model": "m", "input": "FILL"}, "FILL")),
        Case("messages", "anthropic", "/v1/messages", *_text_body(messages, "FILL")),
        Case("count_tokens", "anthropic", "/v1/messages/count_tokens", *_text_body(chat, "FILL")),
        Case("generateContent", "google", "/v1beta/models/m:generateContent", *_text_body(gemini, "FILL")),
        Case("countTokens", "google", "/v1beta/models/m:countTokens", *_text_body(gemini, "FILL")),
    ]


def _headers(provider: str, key: str) -> dict[str, str]:
    if provider == "anthropic":
        return {"x-api-key": key}
    if provider == "google":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


def _url(session: Session, case: Case) -> str:
    return session.base_urls[case.provider] + case.path


def _small_call(proxy: ProxyProcess, other: Session) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    resp = httpx.post(other.base_urls["openai"] + "/chat/completions", json=body,
                      headers=_headers("openai", other.api_key), timeout=60)  # fmt: skip
    return resp.status_code


def send_max_body(proxy: ProxyProcess, session: Session, other: Session, case: Case, unit: bytes) -> httpx.Response:
    """POST a body of exactly MAX_BODY bytes: ``head``, ``unit`` repeated to fill it, ``tail``, and JSON whitespace
    for what is left (streamed in 1 MiB chunks: the test never holds the body). Half-way through the upload the sender
    waits until another session's call has been answered."""
    size = MAX_BODY - len(case.head) - len(case.tail)
    units, pad = divmod(size, len(unit))
    per_chunk = CHUNK // len(unit)
    full = unit * per_chunk
    halfway, answered = threading.Event(), threading.Event()

    def chunks() -> Iterator[bytes]:
        yield case.head
        for sent in range(0, units, per_chunk):
            if sent >= units // 2 and not halfway.is_set():
                halfway.set()
                assert answered.wait(timeout=120), "the other session's call was not answered"
            yield full if sent + per_chunk <= units else unit * (units - sent)
        yield case.tail + b" " * pad

    result: dict[str, Any] = {}

    def send() -> None:
        headers = {**_headers(case.provider, session.api_key), "Content-Type": "application/json",
                   "Content-Length": str(MAX_BODY)}  # fmt: skip
        try:
            result["response"] = httpx.post(_url(session, case), content=chunks(), headers=headers, timeout=300)
        finally:
            halfway.set()

    sender = threading.Thread(target=send)
    sender.start()
    assert halfway.wait(timeout=300)
    statuses = [_small_call(proxy, other)]  # while the big body is on its way
    answered.set()
    while sender.is_alive():  # and while it is parsed, checked and refused
        statuses.append(_small_call(proxy, other))
        sender.join(timeout=0.05)
    sender.join()
    assert set(statuses) == {200}, statuses
    response: httpx.Response = result["response"]
    return response


def _peak_moved_kb(proxy: ProxyProcess, before: dict[str, int]) -> int:
    return proxy.memory_kb()["VmHWM"] - before["VmRSS"]


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case.name)
def test_a_64_mib_prompt_is_refused_within_the_memory_bound(
    proxy_process: ProxyProcess, case: Case
) -> None:
    session = proxy_process.new_session([{"content": "never"}])
    other = proxy_process.new_session([])
    _small_call(proxy_process, other)  # the session's first answer warms its paths before the peak is measured
    proxy_process.reset_peak()
    before = proxy_process.memory_kb()
    resp = send_max_body(proxy_process, session, other, case, NEWLINE)
    message = assert_error(resp, 400, case.provider)
    assert "prompt is too long for the context length" in message
    assert f"budget of {DEFAULT_PROMPT_TOKENS} prompt tokens" in message
    if case.name == "responses":
        assert resp.json()["error"]["code"] == "context_length_exceeded"  # what Codex does not retry
    assert _peak_moved_kb(proxy_process, before) <= PEAK_MULTIPLE * MAX_BODY // 1024


def test_a_64_mib_body_of_tiny_values_is_refused_before_it_is_parsed(proxy_process: ProxyProcess) -> None:
    """``[{},{},...]`` parses into about 20x its size: the count of its values refuses it first."""
    session, other = proxy_process.new_session([{"content": "never"}]), proxy_process.new_session([])
    _small_call(proxy_process, other)
    case = Case("tiny values", "openai", "/chat/completions", b'{"model": "m", "messages": [', b"{}]}")
    proxy_process.reset_peak()
    before = proxy_process.memory_kb()
    message = assert_error(send_max_body(proxy_process, session, other, case, b"{},"), 400, "openai")
    assert "JSON values" in message
    assert _peak_moved_kb(proxy_process, before) <= PEAK_MULTIPLE * MAX_BODY // 1024


def test_a_prompt_within_the_characters_but_over_the_tokens_stops_counting(proxy_process: ProxyProcess) -> None:
    """Under the characters' bound, the tokenizer runs: counted in chunks, it stops past the budget (the demo
    tokenizer reads one token per ``x``)."""
    session = proxy_process.new_session([])
    text = "x" * (DEFAULT_PROMPT_TOKENS * CHARS_PER_TOKEN - 1000)
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
    proxy_process.reset_peak()
    before = proxy_process.memory_kb()
    resp = httpx.post(session.base_urls["google"] + "/v1beta/models/m:countTokens", json=body,
                      headers=_headers("google", session.api_key), timeout=120)  # fmt: skip
    message = assert_error(resp, 400, "google")
    assert f"more than {DEFAULT_PROMPT_TOKENS} tokens in the first" in message
    assert _peak_moved_kb(proxy_process, before) <= 64 * 1024  # the chunks counted, not the whole text (20 MB)


def test_prompts_within_the_budget_are_answered(proxy_process: ProxyProcess) -> None:
    session = proxy_process.new_session([{"content": "done"}])
    text = "word " * 20_000  # over the inline render threshold: tokenized in a worker thread
    count = httpx.post(session.base_urls["anthropic"] + "/v1/messages/count_tokens",
                       json={"model": "m", "messages": [{"role": "user", "content": text}]},
                       headers=_headers("anthropic", session.api_key), timeout=60)  # fmt: skip
    assert count.status_code == 200, count.text
    assert count.json()["input_tokens"] > 20_000
    answer = httpx.post(session.base_urls["openai"] + "/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": text}]},
                        headers=_headers("openai", session.api_key), timeout=60)  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "done"


# ---- the checks ---------------------------------------------------------------------------------------------------


def test_text_chars_counts_everything_a_template_renders_but_images() -> None:
    tools = [{"type": "function", "function": {"name": "n" * 1000, "description": "d" * 5000}}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "t" * 300},
                                     {"type": "image_url", "image_url": {"url": "data:" + "A" * 100_000}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f" * 2000, "arguments": "{}"}}]},
    ]  # fmt: skip
    chars = text_chars(messages, tools)
    assert 1000 + 5000 + 300 + IMAGE_CHARS + 2000 < chars < 9000  # the image's data is not text


def test_a_big_body_of_sparse_json_passes_the_value_count() -> None:
    budget = PromptBudget(1000, "config")
    image = b'{"messages": [{"role": "user", "content": [{"type": "image", "data": "' + b"A" * 100_000 + b'"}]}]}'
    budget.check_body(image)  # big, but a few values: an image parses at its own size
    with pytest.raises(PromptTooLongError, match=r"budget of 1000 prompt tokens \(max_prompt_tokens\)"):
        budget.check_body(b"[" + b"1," * 20_000 + b"1]")
    budget.check_text([{"role": "user", "content": "x" * 100_000}], None, body_bytes=10)  # a small body: no walk
    with pytest.raises(PromptTooLongError, match="100015 characters of text"):
        budget.check_text([{"role": "user", "content": "x" * 100_000}], None, body_bytes=100_050)


def test_encode_stops_counting_past_its_limit(demo_tokenizer: Path) -> None:
    renderer = ChatRenderer(load_tokenizer(str(demo_tokenizer)))
    text = "x" * (COUNT_CHUNK_CHARS * 4)
    with pytest.raises(PromptTooLongError, match=f"in the first {COUNT_CHUNK_CHARS} of its"):
        renderer.encode(text, limit=1000)  # one chunk counted, not four
    assert renderer.encode("x" * 500, limit=1000) == renderer.encode("x" * 500)
    with pytest.raises(PromptTooLongError, match="1200 tokens"):
        renderer.encode("x" * 1200, limit=1199)


# ---- a configured budget on the proxy ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_budget(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy(max_prompt_tokens=64)


def test_a_prompt_over_a_configured_budget_is_refused_and_uses_no_turn(small_budget: RunningProxy) -> None:
    session = small_budget.new_session(script=[{"content": "first"}])
    headers = {"Authorization": f"Bearer {session.api_key}"}
    over = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}  # within 512 characters, not tokens
    for stream in (False, True):  # a passed-through stream is refused before its first byte
        resp = httpx.post(f"{session.openai_base}/chat/completions", json={**over, "stream": stream}, headers=headers)
        assert "budget of 64 prompt tokens" in assert_error(resp, 400, "openai")
    assert session.completions() == []
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    resp = httpx.post(f"{session.openai_base}/chat/completions", json=ok, headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "first"  # the refused call took no turn


def test_the_budget_bounds_token_mode_and_counting(small_budget: RunningProxy) -> None:
    session = small_budget.new_session(script=[{"content": "first"}], token_mode="tokens")
    over = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 400}]}
    headers = {"x-api-key": session.api_key}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        resp = httpx.post(f"{session.anthropic_base}{path}", json=over, headers=headers)
        assert "budget of 64 prompt tokens" in assert_error(resp, 400, "anthropic")
    resp = httpx.post(f"{session.anthropic_base}/v1/messages", json={**over, "messages": [
        {"role": "user", "content": "x" * 4000}]}, headers=headers)  # fmt: skip
    message = assert_error(resp, 400, "anthropic")  # over the characters: refused before any rendering
    assert "characters of text (at most 512, 8 per token)" in message and "(max_prompt_tokens)" in message
    assert session.completions() == []
