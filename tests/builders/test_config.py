"""End-of-turn ids come from config or the tokenizer directory, never from samples."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polar_cli.builders import build_trajectory
from polar_cli.builders.config import BuilderConfig, end_of_turn_ids
from polar_cli.errors import BuildError
from tests.builders.conftest import TokenizerCase
from tests.builders.helpers import IM_END, three_turn_session


def eot(**config: object) -> frozenset[int]:
    return end_of_turn_ids(BuilderConfig.model_validate(config), "prefix_merging")


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
    assert build_trajectory("prefix_merging", three_turn_session(), eos_token_id=[IM_END]).metadata["chains"] == 1
