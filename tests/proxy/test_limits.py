"""A task's ``agent.limits`` (``SessionLimits``): the model's validation, the guard's counting, and a real proxy
refusing the calls beyond a limit in the provider's own error shape (recording nothing for them), clamping one call's
max tokens, and naming the first limit hit on the session."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml
from pydantic import ValidationError

from polar_cli.groups import session_cause
from polar_cli.models import AgentSpec, SessionLimits, SessionResult
from polar_cli.proxy.limits import SessionGuard
from tests.support.docs import ROOT, code_blocks

from .conftest import ProxySession, RunningProxy

# ---- the model ----------------------------------------------------------------------------------------------------


def test_limits_are_optional_positive_ints_and_strict() -> None:
    agent = AgentSpec.model_validate({"harness": "shell", "limits": {"max_model_calls": 5, "repeat_limit": 3}})
    assert agent.limits is not None and agent.limits.set() == {"max_model_calls": 5, "repeat_limit": 3}
    assert AgentSpec(harness="shell").limits is None
    for bad in (
        {"max_model_calls": 0},
        {"max_sampled_tokens": -1},
        {"max_call_tokens": "5"},
        {"max_call_tokens": 2.5},
        {"repeat_limit": 1},
        {"max_calls": 3},
    ):
        with pytest.raises(ValidationError) as caught:
            SessionLimits.model_validate(bad)
        assert next(iter(bad)) in str(caught.value)


# ---- the guard, pure ----------------------------------------------------------------------------------------------


def test_max_model_calls_refuses_the_call_after_the_cap_counting_calls_in_flight() -> None:
    guard = SessionGuard(SessionLimits(max_model_calls=2))
    assert guard.admit() is None and guard.admit() is None  # two concurrent calls
    hit = guard.admit()
    assert hit is not None and hit.message == "limit max_model_calls=2 reached after 2 calls"
    assert guard.tripped.is_set()
    assert guard.admit() is hit  # the first hit stays


def test_a_failed_call_counts_for_nothing_and_reaching_a_cap_is_no_hit() -> None:
    guard = SessionGuard(SessionLimits(max_model_calls=1, max_sampled_tokens=3))
    assert guard.admit() is None
    guard.settle(None)  # failed upstream
    assert guard.admit() is None
    guard.settle([1, 2, 3])
    assert guard.hit is None and not guard.tripped.is_set()  # the harness may stop here and complete
    hit = guard.admit()
    assert hit is not None and hit.name == "max_model_calls"


def test_max_sampled_tokens_and_repeat_limit() -> None:
    guard = SessionGuard(SessionLimits(max_sampled_tokens=5))
    assert guard.admit() is None
    guard.settle([1, 2, 3])
    assert guard.admit() is None  # 3 < 5
    guard.settle([4, 5, 6])
    hit = guard.admit()
    assert hit is not None and hit.message == "limit max_sampled_tokens=5 reached: 6 tokens sampled in 2 calls"

    loop = SessionGuard(SessionLimits(repeat_limit=3))
    for ids in ([1], [2], [2], [3], [3]):
        assert loop.admit() is None
        loop.settle(ids)
    assert loop.hit is None
    assert loop.admit() is None
    loop.settle([3])  # the third [3] in a row
    assert loop.hit is not None and loop.tripped.is_set()
    assert loop.hit.message == "limit repeat_limit=3 reached: the same assistant output (1 tokens) 3 times in a row"
    assert loop.admit() is loop.hit


def test_max_call_tokens_clamps_never_raises() -> None:
    guard = SessionGuard(SessionLimits(max_call_tokens=8))
    for asked, sent in ((None, 8), (100, 8), (5, 5)):
        params: dict[str, Any] = {} if asked is None else {"max_tokens": asked}
        guard.clamp(params)
        assert params["max_tokens"] == sent


# ---- a real proxy -------------------------------------------------------------------------------------------------


def chat(session: ProxySession, **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    headers = {"Authorization": f"Bearer {session.api_key}"}
    return httpx.post(f"{session.openai_base}/chat/completions", headers=headers, json=body, timeout=60)


def messages(session: ProxySession, **extra: Any) -> httpx.Response:
    body = {"model": "m", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(f"{session.anthropic_base}/v1/messages", headers={"x-api-key": session.api_key}, json=body,
                      timeout=60)  # fmt: skip


def turns(*texts: str) -> list[dict[str, Any]]:
    return [{"content": text} for text in texts]


def hit_of(proxy: RunningProxy, session: ProxySession) -> dict[str, Any] | None:
    limits = proxy.http.get(f"/sessions/{session.session_id}").json()["limits"]
    return limits["hit"] if limits else None


def test_openai_chat_call_beyond_max_model_calls_is_refused_in_openai_shape(proxy: RunningProxy) -> None:
    session = proxy.new_session(turns("one", "two", "three"), limits={"max_model_calls": 2})
    assert [chat(session).status_code, chat(session, stream=True).status_code] == [200, 200]  # a stream counts too
    assert hit_of(proxy, session) is None
    refused = chat(session)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["type"] == "permission_error" and "limit max_model_calls=2 reached after 2 calls" in error["message"]
    assert len(session.completions()) == 2  # the refused call records nothing
    sampled = sum(len(c["response_ids"]) for c in session.completions())
    assert hit_of(proxy, session) == {"name": "max_model_calls", "limit": 2, "calls": 2, "sampled_tokens": sampled}


def test_anthropic_call_once_max_sampled_tokens_is_reached_is_refused_in_anthropic_shape(proxy: RunningProxy) -> None:
    session = proxy.new_session(turns("one", "two"), limits={"max_sampled_tokens": 1})
    assert messages(session).status_code == 200
    refused = messages(session, stream=True)
    assert refused.status_code == 403
    body = refused.json()
    assert body["type"] == "error" and body["error"]["type"] == "permission_error"
    assert "limit max_sampled_tokens=1 reached" in body["error"]["message"]
    assert len(session.completions()) == 1


def test_the_same_output_repeat_limit_times_in_a_row_trips_loop_detection(proxy: RunningProxy) -> None:
    session = proxy.new_session(turns("a", "loop", "loop", "loop", "b"), limits={"repeat_limit": 3})
    assert [chat(session).status_code for _ in range(4)] == [200] * 4  # the third "loop" is recorded, and trips it
    hit = hit_of(proxy, session)
    assert hit is not None and hit["name"] == "repeat_limit" and hit["calls"] == 4
    refused = messages(session)
    assert refused.status_code == 403 and "limit repeat_limit=3 reached" in refused.json()["error"]["message"]
    assert len(session.completions()) == 4


def test_max_call_tokens_is_the_clamped_max_tokens_sent_upstream(proxy: RunningProxy) -> None:
    session = proxy.new_session(turns("one", "two", "three"), limits={"max_call_tokens": 7},
                                sampling={"max_tokens": 50})  # fmt: skip
    assert messages(session).status_code == 200  # asks 1000
    assert chat(session, max_tokens=3).status_code == 200  # its own smaller value stays
    assert chat(session).status_code == 200  # asks nothing: the sampling cap, then the limit's
    sent = [c["request_params"]["max_tokens"] for c in session.completions()]
    assert sent == [7, 3, 7]


def test_the_documented_limits_load() -> None:
    block = next(b for b in code_blocks(ROOT / "docs" / "gateway.md") if "limits:" in b.text)
    agent = AgentSpec.model_validate(yaml.safe_load(block.text)["agent"])
    assert agent.limits == SessionLimits(max_model_calls=50, max_sampled_tokens=65536, max_call_tokens=4096,
                                         repeat_limit=3)  # fmt: skip


def test_a_limit_session_is_no_usable_group_sample() -> None:
    result = SessionResult.model_validate({
        "session_id": "t-0", "task_id": "t", "sample_index": 0, "status": "limit", "reward": 0.0, "num_completions": 2,
        "error": "limit max_model_calls=2 reached after 2 calls", "trajectory": {"status": "limit"},
    })  # fmt: skip
    cause = session_cause(result)
    assert cause is not None and cause[0] == "not_completed" and "max_model_calls" in cause[1]
