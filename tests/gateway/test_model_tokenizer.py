"""Where the gateway finds the served model's tokenizer without being told."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polar_cli.gateway.model_tokenizer import ModelTokenizer, ModelTokenizerFinder, available, server_model_source
from polar_cli.proxy.config import ProxyConfig
from polar_cli.proxy.render import demo_tokenizer_dir
from polar_cli.proxy.state import ProxyState


def found(config: ProxyConfig) -> ModelTokenizer | None:
    async def find() -> ModelTokenizer | None:
        state = ProxyState(config)
        try:
            return await ModelTokenizerFinder(state).find()
        finally:
            await state.close()

    return asyncio.run(find())


def test_the_proxys_own_tokenizer_then_the_scripted_demo_one() -> None:
    demo = str(demo_tokenizer_dir())
    assert found(ProxyConfig(backend="scripted")) == ModelTokenizer(demo, "demo")
    assert found(ProxyConfig(backend="scripted", tokenizer=demo)) == ModelTokenizer(demo, "proxy")


def test_a_models_listing_names_the_directory_it_was_loaded_from(tmp_path: Path) -> None:
    listing = {"object": "list", "data": [
        {"id": "other", "root": "/models/other"},
        {"id": "polar-demo", "root": str(tmp_path)},
    ]}  # fmt: skip
    assert server_model_source(listing, "polar-demo") == str(tmp_path)
    assert server_model_source(listing, None) == "/models/other"  # no --model: the server's first, as the proxy uses
    assert server_model_source({"data": [{"id": "Qwen/Qwen3-4B"}]}, None) == "Qwen/Qwen3-4B"  # no root: the id
    assert server_model_source({"data": []}, None) is None
    assert available(str(tmp_path)) and not available(str(tmp_path / "missing"))
    assert not available("no-such-org/no-such-model-polar")  # a hub id is used only when already cached
