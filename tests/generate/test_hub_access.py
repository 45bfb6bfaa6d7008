"""Without the HuggingFace Hub, or with a Hub that refuses: ``polar push-hub`` and the ``hf`` dataset say so in one
line within seconds, naming the repo or dataset, the cause and (for datasets) the local-file option.

The Hub itself is the one thing mocked: an address with nothing listening (``HF_ENDPOINT`` at a closed port), a
stand-in answering HTTP errors (``RefusingHub``) or refusing a wrong token (``FakeHub``). ``huggingface_hub`` and
``datasets`` are the real libraries, over real HTTP.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polar_cli.errors import HubError
from polar_cli.registry import get_dataset
from tests.generate.hub import FakeHub, RefusingHub

ROOT = Path(__file__).resolve().parents[2]
LIBRARY_NOISE = ("Retrying in", "thrown while requesting", "Traceback", "Warning")


def closed_port() -> int:
    """A local port nothing listens on (bound, then released: connecting to it is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def dataset_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "dataset"
    (folder / "traces").mkdir(parents=True)
    (folder / "README.md").write_text("---\nlicense: other\n---\n# exported\n")
    (folder / "traces" / "train-00000.parquet").write_bytes(b"PAR1")
    return folder


def push(folder: Path, endpoint: str, *extra: str, token: str = "hf_wrong") -> tuple[subprocess.CompletedProcess[str],
                                                                                     float]:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update({"PYTHONPATH": str(ROOT), "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"})
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "polar_cli", "push-hub", str(folder), "user/x", "--token", token,
                           *extra], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    return done, time.monotonic() - start


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line, after the progress lines of the steps that ran (stderr is not a terminal here)."""
    assert done.returncode == 3 and done.stdout == ""  # docs/cli.md: the Hub cannot be reached or refused
    lines = [line for line in done.stderr.splitlines() if not line.startswith("polar push-hub: ")]
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert not any(noise in done.stderr for noise in LIBRARY_NOISE)
    return lines[0]


def test_push_hub_without_a_hub_is_one_line_within_seconds(dataset_folder: Path) -> None:
    port = closed_port()
    done, seconds = push(dataset_folder, f"http://127.0.0.1:{port}")
    line = one_error_line(done)
    hub = f"http://127.0.0.1:{port}"
    assert line.startswith(f"Error: cannot push user/x: the HuggingFace Hub at {hub} cannot be reached")
    assert "refused" in line.lower() and seconds < 15


def test_push_hub_prints_each_step_on_stderr_and_the_url_on_stdout(dataset_folder: Path) -> None:
    with FakeHub() as hub:
        done, _ = push(dataset_folder, hub.url, token=hub.token)
        assert set(hub.files["user/x"]) == {"README.md", "traces/train-00000.parquet"}
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{hub.url}/datasets/user/x"
    assert done.stderr.splitlines() == [
        f"polar push-hub: creating dataset repo user/x at {hub.url}",
        f"polar push-hub: uploading 2 files (0.0 MB) from {dataset_folder}",
    ]


def test_push_hub_with_a_refused_token_is_one_line(dataset_folder: Path) -> None:
    with FakeHub() as hub:
        done, _ = push(dataset_folder, hub.url, token="hf_not_the_token")
    line = one_error_line(done)
    assert line.startswith(f"Error: cannot push user/x: the Hub at {hub.url} refused the token (HTTP 401")


@pytest.mark.parametrize("status", [401, 403, 404, 500])
def test_push_hub_http_errors_are_one_line_naming_repo_and_status(dataset_folder: Path, status: int) -> None:
    with RefusingHub(status) as hub:
        done, seconds = push(dataset_folder, hub.url)
    line = one_error_line(done)
    assert line.startswith(f"Error: cannot push user/x: the Hub at {hub.url} ")
    assert f"HTTP {status}" in line and seconds < 30
    assert hub.calls and hub.calls[0].startswith("POST /api/repos/create")


def test_the_hf_dataset_without_a_hub_names_the_local_file_option(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.monotonic()
    with pytest.raises(HubError) as info:
        next(iter(get_dataset("hf").tasks(path="my-org/bugs", instruction="{{ text }}")))
    message = str(info.value)
    assert "\n" not in message and time.monotonic() - start < 10
    assert message.startswith("cannot reach the HuggingFace Hub at http://127.0.0.1:")
    assert "to load my-org/bugs (split train)" in message
    assert "polar generate --dataset hf -O path=/data/rows.jsonl" in message
