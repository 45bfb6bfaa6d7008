"""The inference-backend options: declared once (``commands/backend_options.py``), the same flag, help and meaning in
``polar proxy``, ``run``, ``serve`` and ``generate``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer.main

from polar_cli.cli import build_app
from polar_cli.commands.backend_options import proxy_config, proxy_overrides
from polar_cli.proxy import ProxyConfig

SHARED = {"--backend", "--backend-url", "--model", "--tokenizer", "--script", "--backend-timeout", "--backend-retries",
          "--stream-mode"}  # fmt: skip
COMMANDS = {"proxy": SHARED, "run": SHARED, "serve": SHARED, "generate": SHARED - {"--script"}}
OWN = {("generate", "--model")}  # generate's --model also names the agent's model: its own declaration


def test_every_command_declares_its_backend_options_the_same_way() -> None:
    group = typer.main.get_command(build_app())
    assert isinstance(group, typer.core.TyperGroup)
    declared: dict[str, set[str | None]] = {}
    for name, flags in COMMANDS.items():
        options = {opt: param for param in group.commands[name].params for opt in param.opts}
        assert flags <= options.keys(), name
        for flag in flags - {f for command, f in OWN if command == name}:
            declared.setdefault(flag, set()).add(getattr(options[flag], "help", None))
    assert {flag: len(ways) for flag, ways in declared.items()} == dict.fromkeys(SHARED, 1)


def test_the_options_set_the_proxy_config_fields() -> None:
    overrides = proxy_overrides(
        backend="vllm", backend_url="http://127.0.0.1:9", model="m", tokenizer="t", backend_timeout=5.0,
        backend_retries=0, stream_mode="synthetic",
    )  # fmt: skip
    config = proxy_config(overrides, source="test", port=0)
    assert (config.backend, config.backend_url, config.model, config.tokenizer, config.port) == (
        "vllm", "http://127.0.0.1:9", "m", "t", 0,
    )  # fmt: skip
    assert (config.backend_timeout_s, config.retry.attempts, config.stream_mode) == (5.0, 1, "synthetic")
    untouched = proxy_config(proxy_overrides(), source="test")
    assert untouched.model_dump(exclude={"control_token"}) == ProxyConfig().model_dump(exclude={"control_token"})


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (["run", "--harness", "shell", "--instruction", "x"], "backend_timeout_s"),
        (["generate", "--dataset", "demo", "--out", "never-written"], "backend_timeout_s"),
        (["serve", "--port", "0"], "gateway.proxy.backend_timeout_s"),
    ],
)
def test_a_bad_backend_option_names_its_field_before_anything_starts(command: list[str], field: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "polar_cli", *command, "--backend-timeout", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "POLAR_LOAD_PLUGINS": ""},
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"{field}: Input should be greater than 0" in result.stderr and "Traceback" not in result.stderr


def test_backend_url_repeated_is_a_pool_of_replicas() -> None:
    config = proxy_config(proxy_overrides(backend="vllm", backend_url=["http://a:1", "http://b:2/v1"]), source="t")
    assert config.backend_urls() == ["http://a:1", "http://b:2/v1"]
    assert config.backend_config("http://b:2/v1", pooled=True)["retry"].attempts == 1  # the pool retries itself
    one = proxy_config(proxy_overrides(backend="vllm", backend_url=["http://a:1"]), source="t")
    assert one.backend_url == "http://a:1" and one.backend_urls() == ["http://a:1"]
    result = subprocess.run(
        [sys.executable, "-m", "polar_cli", "proxy", "--backend", "vllm", "--backend-url", "http://a:1",
         "--backend-url", "http://a:1", "--port", "0"],
        capture_output=True, text=True, env={**os.environ, "POLAR_LOAD_PLUGINS": ""}, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "the same backend URL is given twice" in result.stderr and "Traceback" not in result.stderr
