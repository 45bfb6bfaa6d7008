"""The real Codex CLI (it speaks only the Responses API) through the proxy with the scripted backend.

Codex runs a shell call, a freeform ``apply_patch`` call and a final answer; reasoning must round-trip through
``encrypted_content``. Skipped when no Codex CLI is installed (``.ci/setup_harnesses.sh`` installs it into
``${POLAR_HOME:-~/.cache/polar}/harnesses/codex-<version>/``; ``POLAR_CODEX_BIN`` points at another one).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from polar_cli.harnesses.install import harness_root

pytestmark = [pytest.mark.e2e, pytest.mark.harness]
PATCH = "*** Begin Patch\n*** Add File: second.txt\n+second line\n*** End Patch\n"


def codex_binary() -> Path | None:
    configured = os.environ.get("POLAR_CODEX_BIN")
    if configured:
        return Path(configured)
    installed = sorted(harness_root().glob("codex-*/bin/codex"))
    if installed:
        return installed[-1]
    found = shutil.which("codex")
    return Path(found) if found else None


def test_codex_cli_edits_files_through_the_proxy(proxy: Any, tmp_path: Path) -> None:
    binary = codex_binary()
    if binary is None:
        pytest.skip("Codex CLI is not installed (run .ci/setup_harnesses.sh)")
    session = proxy.new_session(
        script=[
            {
                "reasoning_content": "Create the first file with the shell.",
                "tool_calls": [
                    {"id": "call_a", "function": {"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}}
                ],
            },
            {
                "content": "Now the second file.",
                "tool_calls": [{"id": "call_b", "function": {"name": "apply_patch", "arguments": {"input": PATCH}}}],
            },
            {"content": "Created hello.txt and second.txt."},
        ]
    )
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    # a known model name makes Codex offer its freeform apply_patch tool
    (home / "config.toml").write_text(
        'model = "gpt-5.5"\nmodel_provider = "polar"\napproval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n\n[model_providers.polar]\nname = "polar"\n'
        f'base_url = "{session.openai_base}"\nenv_key = "POLAR_TEST_KEY"\nwire_api = "responses"\n\n'
        "[features]\nplugins = false\n\n[analytics]\nenabled = false\n"
    )
    env = {
        **os.environ,
        "CODEX_HOME": str(home),
        "POLAR_TEST_KEY": session.api_key,
        "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(
        [str(binary), "exec", "--skip-git-repo-check", "-C", str(work), "create hello.txt and second.txt"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (work / "hello.txt").read_text() == "hi\n"
    assert (work / "second.txt").read_text() == "second line\n"
    assert "Created hello.txt and second.txt." in result.stdout
    records = session.completions()
    assert len(records) == 3  # one record per generation call
    assert all(r["provider"] == "openai_responses" for r in records)
    assert records[1]["request_messages"][3]["reasoning_content"] == "Create the first file with the shell."
    patch_call = records[2]["request_messages"][5]["tool_calls"][0]["function"]
    assert patch_call["name"] == "apply_patch"
    for before, after in itertools.pairwise(records):
        assert after["prompt_ids"][: len(before["prompt_ids"])] == before["prompt_ids"]
