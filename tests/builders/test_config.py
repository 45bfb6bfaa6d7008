"""End-of-turn ids: from config, a tokenizer directory, the gateway's tokenizer, else the completions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar_cli.builders import BuildContext, build_trajectory
from polar_cli.builders.config import BuilderConfig
from polar_cli.builders.end_of_turn import EndOfTurn, end_of_turn, from_completions
from polar_cli.errors import BuildError
from polar_cli.models import Completion
from tests.builders.conftest import TokenizerCase
from tests.builders.helpers import IM_END, three_turn_session

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def eot(**config: object) -> frozenset[int]:
    return end_of_turn(BuilderConfig.model_validate(config), "prefix_merging").ids


def test_explicit_ids_win() -> None:
    assert eot(eos_token_id=5) == {5}
    assert eot(eos_token_id=[5, 6], tokenizer="/nonexistent") == {5, 6}


def test_from_a_tokenizer_directory_generation_config(demo_tokenizer: TokenizerCase) -> None:
    assert eot(tokenizer=str(demo_tokenizer.path)) == {demo_tokenizer.eot}
    assert eot(tokenizer=demo_tokenizer.path) == {demo_tokenizer.eot}


def test_qwen_generation_config_lists_both_stop_ids(qwen_tokenizer: TokenizerCase) -> None:
    assert eot(tokenizer=str(qwen_tokenizer.path)) == {151645, 151643}
    assert qwen_tokenizer.tokenizer.encode("user assistant\n\n", add_special_tokens=False) == [872, 17847, 271]


def test_without_generation_config_the_tokenizers_eos(demo_tokenizer: TokenizerCase, tmp_path: Path) -> None:
    bare = tmp_path / "tok"
    shutil.copytree(demo_tokenizer.path, bare)
    (bare / "generation_config.json").unlink()
    assert eot(tokenizer=str(bare)) == {demo_tokenizer.eot}


def test_a_loaded_tokenizer_object(demo_tokenizer: TokenizerCase) -> None:
    assert eot(tokenizer=demo_tokenizer.tokenizer) == {demo_tokenizer.eot}
    comps = three_turn_session()
    traj = build_trajectory("prefix_merging", comps, tokenizer=demo_tokenizer.tokenizer)
    assert traj.metadata["end_of_turn_ids"] == [demo_tokenizer.eot]  # the demo id, so nothing merges here
    assert traj.metadata["chains"] == 3


def test_an_unloadable_tokenizer_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"cannot load tokenizer .*eos_token_id="):
        eot(tokenizer=str(tmp_path))


def test_an_empty_id_list_is_refused() -> None:
    from polar_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="eos_token_id"):
        build_trajectory("prefix_merging", three_turn_session(), eos_token_id=[])
    # the paper's rule finds where each turn closed by the id: one chain only with the right one
    merged = build_trajectory("prefix_merging", three_turn_session(), eos_token_id=[IM_END], merge="prompt_prefix")
    assert merged.metadata["chains"] == 1


def vllm_completion(name: str, index: int) -> Completion:
    """A Completion holding exactly what a recorded vLLM answer (tests/fixtures/vllm) returned."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    choice = data["choices"][0]
    return Completion(
        completion_id=f"{name}-{index}", session_id="s1", index=index, provider="openai_chat", model=data["model"],
        request={}, request_messages=[{"role": "user", "content": "hi"}], response_message=choice["message"],
        prompt_ids=data["prompt_token_ids"], response_ids=choice["token_ids"],
        response_logprobs=[e["logprob"] for e in choice["logprobs"]["content"]],
        finish_reason=choice["finish_reason"], started_at=0.0, finished_at=1.0, backend="vllm",
    )  # fmt: skip


def test_from_recorded_vllm_completions() -> None:
    # the tool call stopped on its own (tool_calls) and ends with <|im_end|> = 2; the two truncated ones say nothing
    comps = [vllm_completion("chat_completion", 0), vllm_completion("chat_completion_tool_call", 1),
             vllm_completion("chat_completion_tools", 2)]  # fmt: skip
    assert [c.finish_reason for c in comps] == ["length", "tool_calls", "length"]
    found = end_of_turn(BuilderConfig(), "prefix_merging", completions=comps)
    assert found == EndOfTurn(frozenset({2}), "completions")
    assert from_completions(comps[1:2], "prefix_merging") == {2}
    with pytest.raises(BuildError, match="no recorded completion ended with finish reason stop or tool_calls"):
        from_completions([comps[0], comps[2]], "prefix_merging")


def test_the_gateways_tokenizer_comes_before_the_completions(demo_tokenizer: TokenizerCase, tmp_path: Path) -> None:
    comps = three_turn_session()  # Qwen ids ending with 151645: what the completions alone would say
    context = BuildContext(tokenizer=str(demo_tokenizer.path), tokenizer_source="server")
    found = end_of_turn(BuilderConfig(), "prefix_merging", context=context, completions=comps)
    assert found == EndOfTurn(frozenset({demo_tokenizer.eot}), "server_tokenizer")
    # the builder's own config wins over the gateway's tokenizer
    assert end_of_turn(BuilderConfig(eos_token_id=IM_END), "p", context=context).source == "eos_token_id"
    # a tokenizer the gateway found but cannot load gives way to the completions
    missing = BuildContext(tokenizer=str(tmp_path / "gone"), tokenizer_source="server")
    assert end_of_turn(BuilderConfig(), "p", context=missing, completions=comps) == EndOfTurn(
        frozenset({IM_END}), "completions"
    )
    traj = build_trajectory("prefix_merging", comps, context=context)
    assert traj.metadata["end_of_turn_source"] == "server_tokenizer"
    assert traj.traces[0].metadata["end_of_turn_source"] == "server_tokenizer"
