"""Process helpers the bench scripts share (each script is run as ``python bench/NAME.py``, which puts this folder on
``sys.path``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``proc``'s process group (a vLLM's engine processes, a serve's harnesses), SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def vllm_python() -> Path:
    """The Python of the vLLM venv (``$POLAR_VLLM_VENV``, else the one .ci/setup_vllm.sh makes)."""
    venv = Path(os.environ.get("POLAR_VLLM_VENV") or Path.home() / ".cache" / "polar" / "vllm-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no vLLM venv at {venv}: run .ci/setup_vllm.sh (or set POLAR_VLLM_VENV)")
    return python
