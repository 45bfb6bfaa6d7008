"""Polar-managed installs: idempotent, never half-done, and npm's failures reported with npm's own message."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polar_cli.cli import build_app
from polar_cli.errors import HarnessError
from polar_cli.harnesses import install as installer
from polar_cli.harnesses.install import MARKER, NpmInstall, harness_root
from polar_cli.registry import get_harness


def test_prefix_lives_under_polar_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    spec = NpmInstall("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi")
    assert spec.prefix == tmp_path / "harnesses" / "pi-0.73.1"
    assert not spec.is_installed()
    assert get_harness("pi").tools_dir() == spec.prefix


def test_without_npm_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HarnessError, match="npm was not found"):
        installer.install(NpmInstall("x", "some-package", "1.0.0", "x"))
    assert not any((tmp_path / "harnesses").glob(".x-1.0.0.partial-*"))


def test_a_complete_install_is_not_redone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A prefix with its marker, binary and node is installed: npm is not even looked for."""
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    spec = NpmInstall("x", "some-package", "1.0.0", "x")
    (spec.prefix / "bin").mkdir(parents=True)
    for name in ("x", "node"):
        (spec.prefix / "bin" / name).write_text("")
    assert not spec.is_installed()  # no marker yet: an interrupted install does not count
    (spec.prefix / MARKER).write_text("{}")
    assert spec.is_installed()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert installer.install(spec) == spec.prefix


def test_shell_tools_install_puts_node_in_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    shell = get_harness("shell")
    assert not shell.is_installed()
    shell.install()
    assert shell.is_installed() and (harness_root() / "shell-tools" / "bin" / "node").is_file()


def test_harness_commands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    runner = CliRunner()
    listed = runner.invoke(build_app(), ["harness", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.output)}
    assert rows["pi"]["version"] == "0.73.1" and rows["pi"]["installed"] is False
    assert rows["opencode"]["package"] == "opencode-ai"
    installed = runner.invoke(build_app(), ["harness", "install", "shell"])
    assert installed.exit_code == 0 and "shell: ok" in installed.stdout
    assert installed.stderr == "polar harness install: shell: installing (0/1)\n"  # not a terminal: a plain line
    nothing = runner.invoke(build_app(), ["harness", "install"])
    assert nothing.exit_code != 0


@pytest.mark.harness
def test_npm_failure_carries_npm_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A version that does not exist: npm's own error comes back, and no prefix is left behind (needs the registry)."""
    if os.environ.get("POLAR_OFFLINE"):
        pytest.skip("POLAR_OFFLINE is set")
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    spec = NpmInstall("pi", "@mariozechner/pi-coding-agent", "0.0.0-no-such-version", "pi")
    with pytest.raises(
        HarnessError, match=r"npm install .*0\.0\.0-no-such-version failed .*(ETARGET|notarget|No matching)"
    ):
        installer.install(spec)
    assert not spec.prefix.exists()
    assert not list((tmp_path / "harnesses").glob(".pi-*partial*"))
