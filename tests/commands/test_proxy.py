"""``polar proxy``: starts, prints its URL and how to create a session, serves, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx


def test_polar_proxy_runs_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    from polar_cli.demo_model import build_demo_tokenizer

    tokenizer = build_demo_tokenizer(tmp_path / "tok")
    script = tmp_path / "script.json"
    script.write_text('[{"content": "hello from the script"}]')
    cmd = [
        sys.executable,
        "-m",
        "polar_cli",
        "proxy",
        "--port",
        "0",
        "--journal",
        str(tmp_path / "journal"),
        "--script",
        str(script),
        "--tokenizer",
        str(tokenizer),
    ]
    env = {**os.environ, "POLAR_LOAD_PLUGINS": ""}
    env.pop("POLAR_CONTROL_TOKEN", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"Polar proxy on (http://\S+)", first)
        assert match, first + (proc.stderr.read() if proc.stderr else "")
        url = match.group(1)
        assert "Control token (generated" in proc.stdout.readline()
        token = proc.stdout.readline().strip()
        assert "POST" in proc.stdout.readline() + proc.stdout.readline()
        # another local user, without the token, can neither create nor list sessions
        assert httpx.post(f"{url}/sessions", json={"session_id": "planted"}).status_code == 401
        assert httpx.get(f"{url}/sessions").status_code == 401
        control = {"Authorization": f"Bearer {token}"}
        info = httpx.post(f"{url}/sessions", json={"session_id": "cli"}, headers=control).json()
        assert [s["session_id"] for s in httpx.get(f"{url}/sessions", headers=control).json()["sessions"]] == ["cli"]
        stranger = httpx.get(f"{url}/sessions/cli/completions")
        assert stranger.status_code == 401 and "hello" not in stranger.text
        assert httpx.delete(f"{url}/sessions/cli").status_code == 401
        answer = httpx.post(
            f"{info['base_urls']['openai']}/chat/completions",
            headers={"x-api-key": info["api_key"]},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        ).json()
        assert answer["choices"][0]["message"]["content"] == "hello from the script"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Stopped." in out and "Traceback" not in err
    assert len((tmp_path / "journal" / "cli.jsonl").read_text().splitlines()) == 1


def test_polar_proxy_takes_its_token_from_the_environment(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "polar_cli", "proxy", "--port", "0"]
    env = {**os.environ, "POLAR_LOAD_PLUGINS": "", "POLAR_CONTROL_TOKEN": "from-the-env"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        match = re.search(r"Polar proxy on (http://\S+)", proc.stdout.readline())
        assert match
        shown = proc.stdout.readline()
        assert "--control-token or $POLAR_CONTROL_TOKEN" in shown and "from-the-env" not in shown
        url = match.group(1)
        assert httpx.get(f"{url}/sessions").status_code == 401
        ok = httpx.get(f"{url}/sessions", headers={"Authorization": "Bearer from-the-env"})
        assert ok.status_code == 200 and ok.json() == {"sessions": []}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_polar_proxy_rejects_bad_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "polar_cli", "proxy", "--backend", "vllm"],
        capture_output=True,
        text=True,
        env={**os.environ, "POLAR_LOAD_PLUGINS": ""},
    )
    assert result.returncode == 2 and "needs --backend-url" in result.stderr and "Traceback" not in result.stderr


def test_polar_proxy_stops_on_sigterm_as_on_ctrl_c() -> None:
    cmd = [sys.executable, "-m", "polar_cli", "proxy", "--port", "0"]
    env = {**os.environ, "POLAR_LOAD_PLUGINS": "", "POLAR_CONTROL_TOKEN": "t"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            url = re.findall(r"Polar proxy on (http://\S+)", proc.stdout.readline())[0]
            assert httpx.get(f"{url}/sessions", headers={"Authorization": "Bearer t"}).status_code == 200
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        except BaseException:
            proc.kill()
            raise
    assert (proc.returncode, "Stopped." in out, "Traceback" in err) == (0, True, False), err
