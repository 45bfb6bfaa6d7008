from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_dist import write_plugin_dist

PLUGIN_PACKAGES = {
    "codex": "polar-codex",
    "claude-code": "polar-claude-code",
    "swebench": "polar-swebench",
    "mini-swe-agent": "polar-mini-swe-agent",
    "aider": "polar-aider",
}


def polar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "polar_cli", *args], capture_output=True, text=True, env=full_env, timeout=120
    )


def test_version_and_help() -> None:
    from polar_cli import __version__

    out = polar("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"polar {__version__}"
    out = polar("--help")
    assert out.returncode == 0 and "plugins" in out.stdout


def test_plugins_json_lists_builtins_and_plugin_packages() -> None:
    out = polar("plugins", "--json", env={"POLAR_LOAD_PLUGINS": ",".join(PLUGIN_PACKAGES)})
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    by_name = {(row["kind"], row["name"]): row for row in rows}
    assert by_name[("dataset", "tasks_file")]["package"] == "polar-rl"
    assert by_name[("harness", "codex")]["package"] == "polar-codex"
    assert by_name[("harness", "claude_code")]["package"] == "polar-claude-code"
    assert by_name[("harness", "mini_swe_agent")]["package"] == "polar-mini-swe-agent"
    assert by_name[("harness", "aider")]["package"] == "polar-aider"
    assert by_name[("evaluator", "swebench_harness")]["package"] == "polar-swebench"
    assert by_name[("dataset", "swegym")]["package"] == "polar-swebench"
    assert by_name[("dataset", "swebench_verified")]["package"] == "polar-swebench"
    assert all(row["version"] for row in rows)


def test_sixteen_harnesses_each_with_a_real_cli_doctor_test() -> None:
    """Every registered harness (built-in or from a plugin package) is driven by its real CLI in some doctor test."""
    out = polar("plugins", "--json", env={"POLAR_LOAD_PLUGINS": ",".join(PLUGIN_PACKAGES)})
    harnesses = sorted(row["name"] for row in json.loads(out.stdout) if row["kind"] == "harness")
    assert len(harnesses) >= 16, harnesses
    root = Path(__file__).resolve().parents[2]
    tests = "\n".join(p.read_text() for p in [*root.glob("tests/harnesses/test_*.py"),
                                              *root.glob("plugins/*/tests/test_*.py")])  # fmt: skip
    assert not [name for name in harnesses if f'"{name}"' not in tests], "a harness without a real-CLI test"


def test_plugins_all_shows_disabled() -> None:
    out = polar("plugins", "--json", "--all", env={"POLAR_LOAD_PLUGINS": "codex"})
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert {row["plugin"] for row in payload["disabled"]} >= {"claude-code", "swebench"}
    assert "codex" in {row["name"] for row in payload["components"]}


def test_plugins_table() -> None:
    out = polar("plugins", env={"POLAR_LOAD_PLUGINS": "codex", "COLUMNS": "200"})
    assert out.returncode == 0
    assert "polar-codex" in out.stdout


def test_duplicate_harness_fails_naming_both_packages(tmp_path: Path) -> None:
    source = """
from polar_cli import hookimpl
from polar_cli.interfaces import Harness


class Impostor(Harness):
    name = "codex"

    def launch(self, context):
        return None


@hookimpl
def register_harnesses(register):
    register(Impostor())
"""
    write_plugin_dist(
        tmp_path,
        package="polar-impostor",
        version="9.9",
        entry_point="impostor",
        module="polar_impostor",
        source=source,
    )
    env = {"POLAR_LOAD_PLUGINS": "codex,impostor", "PYTHONPATH": str(tmp_path)}
    out = polar("plugins", env=env)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    line = out.stderr.strip()
    assert line.count("\n") == 0
    assert "duplicate harness name 'codex'" in line
    assert "polar-codex" in line and "polar-impostor" in line


def test_polar_error_is_one_line_unless_debug(tmp_path: Path) -> None:
    write_plugin_dist(
        tmp_path,
        package="polar-broken",
        version="0.1",
        entry_point="broken",
        module="polar_broken_cli",
        source="raise RuntimeError('boom')\n",
    )
    env = {"POLAR_LOAD_PLUGINS": "broken", "PYTHONPATH": str(tmp_path)}
    out = polar("plugins", env=env)
    assert out.returncode == 2  # docs/cli.md: a plugin that does not load
    assert out.stderr.startswith("Error: plugin 'broken'") and "Traceback" not in out.stderr
    out = polar("plugins", env={**env, "POLAR_DEBUG": "1"})
    assert "Traceback" in out.stderr


@pytest.mark.parametrize("package", sorted(PLUGIN_PACKAGES.values()))
def test_plugin_packages_are_installed(package: str) -> None:
    from importlib.metadata import distribution

    assert distribution(package).entry_points.select(group="polar")


COMMAND_PLUGIN = """
import typer

from polar_cli import hookimpl


@hookimpl
def register_commands(app):
    app.command("hello")(lambda: typer.echo("hi"))
"""


def test_builtin_commands_come_through_register_commands_before_a_plugins(tmp_path, monkeypatch) -> None:
    import click
    from typer.main import get_command

    from polar_cli.cli import build_app
    from polar_cli.plugins.commands import register_commands
    from polar_cli.registry import LOAD_ENV, get_plugin_manager, reset_registry

    write_plugin_dist(tmp_path, package="polar-hello", version="0.1", entry_point="hello", module="polar_hello_cmd",
                      source=COMMAND_PLUGIN)  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(LOAD_ENV, "hello")
    reset_registry()
    hooks = get_plugin_manager().hook.register_commands.get_hookimpls()
    assert register_commands in [impl.function for impl in hooks]
    group = get_command(build_app())
    names = group.list_commands(click.Context(group))
    assert names == ["run", "generate", "export", "push-hub", "verify", "view", "replay", "serve", "submit", "status",
                     "proxy", "doctor", "plugins", "hello", "inference", "harness", "runtimes"]  # fmt: skip
    reset_registry()
