"""The scripted backend's script variants (one per sample of a task) and replayed turns (carried token ids, and the
``expect`` check of each request against the original's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import BackendError, ConfigError
from polar_cli.models.chat import ChatRequest
from polar_cli.proxy import session_options
from polar_cli.proxy.backends.script_check import SESSION_PATH, mask_session, tools_digest
from polar_cli.proxy.backends.scripted import ScriptedClient, choose_variant, load_script
from polar_cli.registry import get_backend

from .conftest import LoopThread

REQUEST = ChatRequest(model="m", messages=[{"role": "system", "content": "cwd: /tmp/x/local-sess-1-ab12/session"},
                                           {"role": "user", "content": "hi"}])  # fmt: skip
VARIANTS = {"variants": [[{"content": "good"}], [{"content": "bad"}], [{"content": "ugly"}]]}


def test_cycle_gives_sample_k_the_variant_k_mod_n() -> None:
    assert [choose_variant(3, k) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_seeded_draw_is_deterministic_per_seed_and_sample_index() -> None:
    draws = [choose_variant(4, k, choose="seeded", seed=7) for k in range(64)]
    assert draws == [choose_variant(4, k, choose="seeded", seed=7) for k in range(64)]  # the same, every time
    assert set(draws) == {0, 1, 2, 3}  # a draw, not one variant for all
    assert draws != [choose_variant(4, k, choose="seeded", seed=8) for k in range(64)]  # the seed matters
    # pinned: the draw is a sha256 of "seed:sample_index", the same in any process and Python version
    assert [choose_variant(4, k, choose="seeded", seed=0) for k in range(8)] == [
        choose_variant(4, k, choose="seeded") for k in range(8)
    ]


def test_load_script_picks_the_samples_variant_and_checks_every_variant() -> None:
    assert [load_script(VARIANTS, sample_index=k)[0].content for k in range(4)] == ["good", "bad", "ugly", "good"]
    seeded = {**VARIANTS, "choose": "seeded", "seed": 3}
    picked = [load_script(seeded, sample_index=k)[0].content for k in range(12)]
    assert picked == [VARIANTS["variants"][choose_variant(3, k, choose="seeded", seed=3)][0]["content"]
                      for k in range(12)]  # fmt: skip
    with pytest.raises(ConfigError, match=r"variants\[1\].*typo"):
        load_script({"variants": [[{"content": "ok"}], [{"typo": 1}]]})
    with pytest.raises(ConfigError, match="choose"):
        load_script({**VARIANTS, "choose": "random"})


def client(demo_tokenizer: Path, **config: Any) -> ScriptedClient:
    made = get_backend("scripted").client(tokenizer=str(demo_tokenizer), **config)
    assert isinstance(made, ScriptedClient)
    return made


def test_a_sessions_sample_index_reaches_the_backend_and_picks_its_variant(
    loop_thread: LoopThread, demo_tokenizer: Path
) -> None:
    backend = client(demo_tokenizer)
    run: Callable[[Any], Any] = loop_thread.run
    answers = []
    for k in range(4):
        metadata, options = session_options(backend, {"script": VARIANTS, "sample_index": k}, None)
        assert options == {"script": VARIANTS, "sample_index": k} and metadata == {"sample_index": k}
        run(backend.open_session(f"s{k}", options))
        answers.append(run(backend.generate(REQUEST, session_id=f"s{k}")).message["content"])
    assert answers == ["good", "bad", "ugly", "good"]


def test_the_proxy_wide_script_may_hold_variants_too(loop_thread: LoopThread, demo_tokenizer: Path) -> None:
    backend = client(demo_tokenizer, script={**VARIANTS, "choose": "cycle"})
    _, options = session_options(backend, {"sample_index": 2}, None)
    loop_thread.run(backend.open_session("p", options))
    assert loop_thread.run(backend.generate(REQUEST, session_id="p")).message["content"] == "ugly"


def test_a_turn_can_carry_its_ids_and_logprobs(loop_thread: LoopThread, demo_tokenizer: Path) -> None:
    backend = client(demo_tokenizer, script=[{"content": "x", "response_ids": [5, 6, 7], "logprobs": [-1, -2, -3]},
                                             {"content": "y", "response_ids": [10**9]}])  # fmt: skip
    first = loop_thread.run(backend.generate(REQUEST, session_id="c"))
    assert (first.response_ids, first.response_logprobs) == ([5, 6, 7], [-1.0, -2.0, -3.0])
    with pytest.raises(BackendError, match="outside the tokenizer's vocabulary"):
        loop_thread.run(backend.generate(REQUEST, session_id="c"))
    with pytest.raises(ConfigError, match="logprobs needs response_ids"):
        load_script([{"content": "x", "logprobs": [-1.0]}])


def expect_of(request: ChatRequest, session_id: str) -> dict[str, Any]:
    return {"messages": mask_session(request.messages, session_id), "tools_sha256": tools_digest(request.tools)}


def test_expect_passes_the_same_request_in_another_session(loop_thread: LoopThread, demo_tokenizer: Path) -> None:
    original = ChatRequest(model="m", messages=[{"role": "system", "content": "cwd: /tmp/local-orig-1-x/session"},
                                                {"role": "user", "content": "hi"}])  # fmt: skip
    expect = expect_of(original, "orig-1")
    assert expect["messages"][0]["content"] == f"cwd: {SESSION_PATH}"
    backend = client(demo_tokenizer, script=[{"content": "ok", "expect": expect}])
    replayed = ChatRequest(model="m", messages=[{"role": "system", "content": "cwd: /tmp/local-sess-1-ab12/session"},
                                                {"role": "user", "content": "hi"}])  # fmt: skip
    assert loop_thread.run(backend.generate(replayed, session_id="sess-1")).message["content"] == "ok"


def test_expect_fails_a_diverging_request_naming_where(loop_thread: LoopThread, demo_tokenizer: Path) -> None:
    expect = {"messages": [{"role": "system", "content": f"cwd: {SESSION_PATH}"}, {"role": "user", "content": "ho"}]}
    backend = client(demo_tokenizer, script=[{"content": "ok", "expect": expect}] * 2)
    with pytest.raises(BackendError) as failed:
        loop_thread.run(backend.generate(REQUEST, session_id="sess-1"))
    assert failed.value.status == 409
    assert str(failed.value) == ('scripted replay: session sess-1, call 1: message 1 (user).content: original "ho", '
                                 'replay "hi"')  # fmt: skip
    with pytest.raises(BackendError) as again:  # a harness retrying the call is not answered by the next turn
        loop_thread.run(backend.generate(REQUEST, session_id="sess-1"))
    assert str(again.value) == str(failed.value)
    shorter = {"messages": expect["messages"][:1]}
    backend = client(demo_tokenizer, script=[{"content": "ok", "expect": shorter}], on_mismatch="warn")
    assert loop_thread.run(backend.generate(REQUEST, session_id="sess-1")).message["content"] == "ok"  # logged only


def test_a_script_that_names_its_sample_index_wins_over_the_sessions() -> None:
    """``polar generate`` runs each sample as a one-sample task (its session is sample 0) and names the sample."""
    assert [load_script({**VARIANTS, "sample_index": 1}, sample_index=k)[0].content for k in range(3)] == ["bad"] * 3
