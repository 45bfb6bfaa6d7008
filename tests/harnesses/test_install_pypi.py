"""The venv installer of PyPI harnesses: a real ``pip install`` into a Polar-managed venv, renamed into place.

A failed install leaves nothing behind: that is ``install.managed_install``, shared with npm and tested there
(tests/harnesses/test_install.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from polar_cli.harnesses import pypi
from polar_cli.harnesses.install import MARKER
from polar_cli.harnesses.pypi import VenvInstall

# a tiny pure-Python package with a console script and no dependencies
TINY = VenvInstall("tiny", "cowsay", "6.1", "cowsay")


def test_a_real_install_is_relocated_marked_and_not_redone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    assert TINY.prefix == tmp_path / "harnesses" / "tiny-6.1" and not TINY.is_installed()
    assert pypi.install(TINY) == TINY.prefix and TINY.is_installed()
    assert not list((tmp_path / "harnesses").glob(".tiny-6.1.partial-*"))
    # the scripts name the final venv, not the directory it was built in
    assert TINY.bin_path.read_text().splitlines()[0] == f"#!{TINY.prefix}/bin/python"
    assert "partial" not in (TINY.prefix / "pyvenv.cfg").read_text()
    done = subprocess.run([str(TINY.bin_path), "-t", "moo"], capture_output=True, text=True, check=True)
    assert "moo" in done.stdout
    marker = json.loads((TINY.prefix / MARKER).read_text())
    assert (marker["package"], marker["version"], marker["binary"]) == ("cowsay", "6.1", "cowsay")
    assert pypi.install(TINY) == TINY.prefix  # complete: nothing is redone
    assert json.loads((TINY.prefix / MARKER).read_text())["installed_at"] == marker["installed_at"]


def test_relocate_scripts_rewrites_only_files_naming_the_build_dir(tmp_path: Path) -> None:
    partial, final = tmp_path / ".x.partial-1", tmp_path / "x"
    (partial / "bin").mkdir(parents=True)
    (partial / "bin" / "cli").write_text(f"#!{partial}/bin/python\nimport x\n")
    (partial / "bin" / "other").write_text("#!/usr/bin/env python\n")
    (partial / "bin" / "python").symlink_to("/usr/bin/python3")
    (partial / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = python -m venv {partial}\n")
    assert pypi.relocate_scripts(partial, final) == 2
    assert (partial / "bin" / "cli").read_text().startswith(f"#!{final}/bin/python\n")
    assert (partial / "bin" / "other").read_text() == "#!/usr/bin/env python\n"
    assert (partial / "bin" / "python").is_symlink()
