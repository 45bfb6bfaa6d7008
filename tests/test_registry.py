from __future__ import annotations

import pytest

from polar_cli.errors import PluginError, UnknownComponentError
from polar_cli.registry import (
    DEFAULT_PLUGINS,
    LOAD_ENV,
    did_you_mean,
    get_builder,
    get_dataset,
    get_harness,
    get_registry,
    reset_registry,
)
from tests.support.fake_dist import write_plugin_dist

HARNESS_PLUGIN = """
from polar_cli import hookimpl
from polar_cli.interfaces import Harness


class Echo(Harness):
    name = {name!r}

    def launch(self, context):
        return None


@hookimpl
def register_harnesses(register):
    register(Echo())
"""


def use_plugins(monkeypatch: pytest.MonkeyPatch, names: str) -> None:
    monkeypatch.setenv(LOAD_ENV, names)
    reset_registry()


def test_builtins_only_by_default() -> None:
    registry = get_registry()
    packages = {reg.source.package for reg in registry.registrations()}
    assert packages == {"polar-rl"}
    assert set(registry.sources) == set(DEFAULT_PLUGINS)


def test_unknown_name_lists_available() -> None:
    with pytest.raises(UnknownComponentError, match=r"unknown dataset 'nope'; available: .*tasks_file"):
        get_dataset("nope")
    with pytest.raises(UnknownComponentError, match="unknown harness 'nope'; available:"):
        get_harness("nope")


def test_entry_point_plugin_loads(tmp_path, monkeypatch) -> None:
    write_plugin_dist(
        tmp_path,
        package="polar-echo",
        version="1.2.3",
        entry_point="echo",
        module="polar_echo_test",
        source=HARNESS_PLUGIN.format(name="echo"),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    use_plugins(monkeypatch, "echo")
    harness = get_harness("echo")
    assert harness.name == "echo"
    reg = next(r for r in get_registry().registrations("harness") if r.name == "echo")
    assert (reg.source.package, reg.source.version) == ("polar-echo", "1.2.3")


def test_allow_list_excludes_other_plugins(tmp_path, monkeypatch) -> None:
    write_plugin_dist(
        tmp_path,
        package="polar-echo",
        version="1.0",
        entry_point="echo",
        module="polar_echo_test2",
        source=HARNESS_PLUGIN.format(name="echo2"),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    write_plugin_dist(tmp_path / "other", package="polar-other", version="1.0", entry_point="other",
                      module="polar_other_test", source=HARNESS_PLUGIN.format(name="other"))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    use_plugins(monkeypatch, "other")  # an installed plugin, not this one
    assert get_harness("other").name == "other"
    with pytest.raises(UnknownComponentError):
        get_harness("echo2")


def test_an_unknown_name_suggests_the_closest_with_dash_and_underscore_alike(tmp_path, monkeypatch) -> None:
    assert did_you_mean("claude-code", ["claude_code", "qwen_code", "codex"]) == " (did you mean 'claude_code'?)"
    assert did_you_mean("Qwen-Code", ["claude_code", "qwen_code"]) == " (did you mean 'qwen_code'?)"
    assert did_you_mean("prefix_merge", ["per_request", "prefix_merging"]) == " (did you mean 'prefix_merging'?)"
    assert did_you_mean("zzz", ["per_request", "prefix_merging"]) == ""
    write_plugin_dist(tmp_path, package="polar-echo", version="1.0", entry_point="echo", module="polar_echo_dym",
                      source=HARNESS_PLUGIN.format(name="my_agent"))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    use_plugins(monkeypatch, "echo")
    with pytest.raises(UnknownComponentError, match=r"unknown harness 'my-agent' \(did you mean 'my_agent'\?\); "):
        get_harness("my-agent")
    with pytest.raises(UnknownComponentError, match=r"unknown builder 'per-request' \(did you mean 'per_request'"):
        get_builder("per-request")


def test_polar_load_plugins_naming_no_installed_plugin_is_an_error(monkeypatch) -> None:
    use_plugins(monkeypatch, "codex,polar-swebench")
    with pytest.raises(PluginError, match=r"\$POLAR_LOAD_PLUGINS names 'polar-swebench', which no installed plugin is "
                       r"\(did you mean 'swebench'\?\): it is a comma-separated list of plugin entry-point names"):
        get_registry()
    use_plugins(monkeypatch, "")  # empty: none, and no error
    assert {reg.source.package for reg in get_registry().registrations()} == {"polar-rl"}


def test_duplicate_names_name_both_sources(tmp_path, monkeypatch) -> None:
    for package, module in (("polar-one", "polar_one_test"), ("polar-two", "polar_two_test")):
        write_plugin_dist(
            tmp_path / package,
            package=package,
            version="0.1",
            entry_point=package,
            module=module,
            source=HARNESS_PLUGIN.format(name="twin"),
        )
        monkeypatch.syspath_prepend(str(tmp_path / package))
    use_plugins(monkeypatch, "polar-one,polar-two")
    with pytest.raises(PluginError, match=r"duplicate harness name 'twin'.*polar-one.*polar-two"):
        get_registry()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("register(Echo)", "registered the class Echo"),
        ("register(object())", "does not subclass Harness"),
        ("Echo.name = ''\n    register(Echo())", "without a name"),
        ("Echo.options = dict\n    register(Echo())", "options are not a strict pydantic model"),
        ("import pydantic\n    Echo.options = pydantic.create_model('Loose')\n    register(Echo())", "extra='forbid'"),
    ],
)
def test_bad_registrations(tmp_path, monkeypatch, body: str, message: str) -> None:
    source = HARNESS_PLUGIN.format(name="x").replace("register(Echo())", body)
    module = f"polar_bad_{abs(hash(message))}"
    write_plugin_dist(tmp_path, package="polar-bad", version="0.1", entry_point="bad", module=module, source=source)
    monkeypatch.syspath_prepend(str(tmp_path))
    use_plugins(monkeypatch, "bad")
    with pytest.raises(PluginError, match=message):
        get_registry()


def test_broken_plugin_import_is_a_plugin_error(tmp_path, monkeypatch) -> None:
    write_plugin_dist(
        tmp_path,
        package="polar-broken",
        version="0.1",
        entry_point="broken",
        module="polar_broken_test",
        source="raise ImportError('missing dependency foo')\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    use_plugins(monkeypatch, "broken")
    with pytest.raises(
        PluginError, match=r"plugin 'broken' from polar-broken 0.1 failed to load.*missing dependency foo"
    ):
        get_registry()


def test_unknown_hook_is_rejected(tmp_path, monkeypatch) -> None:
    source = "from polar_cli import hookimpl\n\n@hookimpl\ndef register_widgets(register):\n    pass\n"
    write_plugin_dist(tmp_path, package="polar-w", version="0.1", entry_point="w", module="polar_w_test", source=source)
    monkeypatch.syspath_prepend(str(tmp_path))
    use_plugins(monkeypatch, "w")
    with pytest.raises(PluginError, match="unknown hook"):
        get_registry()
