"""``polar_cli.api``, the plugin API: complete, importable, and enough for the plugin examples in docs/plugins.md."""

from __future__ import annotations

import re
from typing import Any

import pytest

import polar_cli.api as api
from polar_cli.errors import ConfigError
from tests.support.docs import ROOT, code_blocks


def test_all_names_every_public_name_of_the_module() -> None:
    public = {name for name, value in vars(api).items() if not name.startswith("_") and name != "annotations"}
    assert sorted(api.__all__) == sorted(public)
    assert len(set(api.__all__)) == len(api.__all__)


def test_the_docstring_maps_every_name() -> None:
    doc = api.__doc__ or ""
    assert [name for name in api.__all__ if not re.search(rf"\b{name}\b", doc)] == []


def test_the_plugin_docs_examples_run_against_the_api() -> None:
    blocks = code_blocks(ROOT / "docs" / "plugins.md")
    skeleton, options = [block.text for block in blocks if block.language == "python"]
    namespace: dict[str, Any] = {"__name__": "polar_mytool"}
    exec(compile(skeleton, "docs/plugins.md", "exec"), namespace)
    registered: list[api.Harness] = []
    namespace["register_harnesses"](register=registered.append)
    [tool] = registered
    context = api.HarnessContext(instruction="go", model="m", api_key="k", base_urls={"openai": "http://gw/s/1/v1"},
                                 home="/polar/home", workdir="/polar/session", tools="/polar/tools")  # fmt: skip
    launch = tool.launch(context)
    assert launch.argv[:2] == ["/polar/tools/bin/mytool", "--yes"] and launch.env["MYTOOL_BASE_URL"] == "http://gw/s/1/v1"

    exec(compile(options, "docs/plugins.md", "exec"), namespace)
    harness = namespace["MyTool"]()
    assert harness.build(context).argv[:2] == ["--max-turns", "20"]
    unknown = r"harness 'mytool': unknown config max_turn \(did you mean 'max_turns'\?\) \(known: max_turns, settings\)"
    with pytest.raises(ConfigError, match=unknown):
        harness.check_config({"max_turn": 3})
