"""The apptainer runtime.

No apptainer binary can be installed here, so the unit tests mock ONLY the binary invocation: ``config.binary``
points at ``fake_apptainer.py``, a recording stand-in that emulates ``instance start/list/stop`` and runs ``exec``'d
commands on the host with the binds translated. spython's Instance, our argv building, the subprocesses, the exec
wrapper, timeouts and kills are all real. ``test_real_apptainer`` runs only where an ``apptainer`` binary exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import RuntimeContext
from polar_cli.models.task import Mount, RuntimeSpec
from polar_cli.registry import get_runtime
from polar_cli.runtimes.apptainer import ApptainerHandle
from polar_cli.runtimes.container import COPY_SCRIPT, EXEC_SCRIPT, KILL_SCRIPT
from tests.runtimes.conftest import TEST_IMAGE, gone, run, wait_for_file

FAKE = Path(__file__).with_name("fake_apptainer.py")


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, Path]:
    """(binary, log): an executable copy of the fake that logs to ``log``."""
    log = tmp_path / "fake" / "calls.jsonl"
    log.parent.mkdir()
    binary = tmp_path / "fake" / "apptainer"
    source = FAKE.read_text().replace("@LOG@", str(log))
    binary.write_text(f"#!{sys.executable}\n{source}")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary, log


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def spec(binary: Path, **fields: Any) -> RuntimeSpec:
    config = {"binary": str(binary), **fields.pop("config", {})}
    return RuntimeSpec(backend="apptainer", image=fields.pop("image", "/images/task.sif"), config=config, **fields)


async def start(rspec: RuntimeSpec, scratch_root: Path, tools_dir: Path | None = None) -> ApptainerHandle:
    env = {"POLAR_GATEWAY_URL": "http://127.0.0.1:9/s"}
    context = RuntimeContext("a1", env=env, tools_dir=tools_dir, scratch_root=scratch_root)
    handle = await get_runtime("apptainer").start(rspec, context)
    assert isinstance(handle, ApptainerHandle)
    return handle


def test_instance_start_and_exec_commands(fake: tuple[Path, Path], scratch_root: Path, tmp_path: Path) -> None:
    binary, log = fake
    tools, data = tmp_path / "tools", tmp_path / "data"
    tools.mkdir()
    data.mkdir()
    rspec = spec(
        binary, env={"SPEC_VAR": "a,b c"}, network="none", cpus=2, memory="1G",
        mounts=[Mount(source=str(data), target="/data", read_only=True)], config={"options": ["--nv"]},
    )  # fmt: skip

    async def body() -> None:
        async with await start(rspec, scratch_root, tools_dir=tools) as handle:
            scratch = handle.scratch
            started = next(c for c in calls(log) if c["argv"][1:3] == ["instance", "start"])
            assert started["argv"] == [
                str(binary), "instance", "start", "--containall",
                "--bind", f"{scratch.session}:/polar/session",
                "--home", f"{scratch.home}:/polar/home",
                "--bind", f"{scratch.run}:/polar/run",
                "--bind", f"{tools}:/polar/tools:ro",
                "--bind", f"{data}:/data:ro",
                "--overlay", f"{scratch.root}/overlay",
                "--net", "--network", "none",
                "--cpus", "2", "--memory", "1G", "--nv",
                "/images/task.sif", handle.name,
            ]  # fmt: skip
            assert handle.name == f"polar-{scratch.root.name}"
            assert (scratch.root / "overlay").is_dir()

            hostile = "hi; rm -rf / $(touch pwned)"
            result = await handle.exec(["echo", hostile], env={"CALL_VAR": "call"})
            assert result.ok and result.stdout == hostile + "\n"
            executed = calls(log)[-1]
            assert executed["argv"] == [
                str(binary), "exec", "--cleanenv", "--pwd", "/polar/session", f"instance://{handle.name}",
                "/bin/sh", "-c", EXEC_SCRIPT, "polar-exec", "/polar/run/exec-0.pid", "/dev/null", "echo", hostile,
            ]  # fmt: skip
            # the environment travels as APPTAINERENV_* variables of the client process, never on a command line
            assert executed["env"] == {
                "APPTAINERENV_POLAR_GATEWAY_URL": "http://127.0.0.1:9/s",
                "APPTAINERENV_SPEC_VAR": "a,b c",
                "APPTAINERENV_CALL_VAR": "call",
                "APPTAINERENV_POLAR_SESSION_ID": "a1",
                "APPTAINERENV_POLAR_SESSION_DIR": "/polar/session",
                "APPTAINERENV_PREPEND_PATH": "/polar/tools/bin",
            }
            assert not (handle.session_dir / "pwned").exists()
            assert (await handle.exec(["pwd"], cwd="/polar/session")).stdout.strip() == str(scratch.session)

        stopped = calls(log)[-1]["argv"]
        assert stopped == [str(binary), "instance", "stop", "-t", "5", handle.name]

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_overlay_and_containall_options(fake: tuple[Path, Path], scratch_root: Path) -> None:
    binary, log = fake

    async def body() -> None:
        rspec = spec(binary, config={"overlay": "/shared/overlay.img", "containall": False})
        async with await start(rspec, scratch_root):
            argv = next(c for c in calls(log) if c["argv"][1:3] == ["instance", "start"])["argv"]
            assert "--containall" not in argv
            assert argv[argv.index("--overlay") + 1] == "/shared/overlay.img"
        async with await start(spec(binary, config={"overlay": False}), scratch_root):
            argv = [c for c in calls(log) if c["argv"][1:3] == ["instance", "start"]][-1]["argv"]
            assert "--overlay" not in argv and "--containall" in argv

    run(body())


def test_timeout_and_cancel_kill_inside_the_instance(fake: tuple[Path, Path], scratch_root: Path) -> None:
    binary, log = fake

    async def body() -> None:
        handle = await start(spec(binary), scratch_root)
        script = "sleep 300 & echo $! > child.pid; wait"  # relative: the fake translates whole arguments only
        result = await handle.exec(["sh", "-c", script], timeout=3.0)
        assert result.timed_out
        assert gone(int((handle.session_dir / "child.pid").read_text()))
        kills = [c["argv"] for c in calls(log) if KILL_SCRIPT in c["argv"]]
        assert kills and kills[0][-2] == "TERM"  # `sh -c KILL_SCRIPT sh TERM <pid>` inside the instance

        task = asyncio.create_task(handle.exec(["sh", "-c", "echo $$ > me.pid; exec sleep 300"]))
        pid = int(await wait_for_file(handle.session_dir / "me.pid"))
        await handle.cancel()
        await asyncio.wait_for(task, 30)
        assert gone(pid)
        assert calls(log)[-1]["argv"] == [str(binary), "instance", "stop", "-t", "1", handle.name]
        assert not handle.scratch.root.exists()

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_files_through_binds_and_staging(fake: tuple[Path, Path], scratch_root: Path, tmp_path: Path) -> None:
    binary, log = fake
    data = tmp_path / "data"
    data.mkdir()
    single = tmp_path / "one.txt"
    single.write_text("one")

    async def body() -> None:
        rspec = spec(binary, mounts=[Mount(source=str(data), target="/data")])
        async with await start(rspec, scratch_root) as handle:
            await handle.write_file("notes.txt", "in session")
            assert (handle.session_dir / "notes.txt").read_text() == "in session"
            await handle.upload(single, "/data/sub/one.txt")  # outside session/home: staged, then cp inside
            assert (data / "sub" / "one.txt").read_text() == "one"
            copies = [c["argv"] for c in calls(log) if COPY_SCRIPT in c["argv"]]  # mkdir and cp in one command
            assert [argv[-3:] for argv in copies] == [["/data/sub", "/data/sub/one.txt", ""]]
            await handle.download("/data/sub/one.txt", tmp_path / "back.txt")
            assert (tmp_path / "back.txt").read_text() == "one"

    run(body())


def test_failures(fake: tuple[Path, Path], scratch_root: Path) -> None:
    binary, _ = fake
    with pytest.raises(RuntimeFailure, match="needs /no/such/apptainer on PATH"):
        missing = RuntimeSpec(backend="apptainer", image="x.sif", config={"binary": "/no/such/apptainer"})
        run(start(missing, scratch_root))
    with pytest.raises(ConfigError, match="needs 'image'"):
        run(start(RuntimeSpec(backend="apptainer"), scratch_root))
    with pytest.raises(ConfigError, match="unknown config"):
        run(start(spec(binary, config={"writable": True}), scratch_root))
    with pytest.raises(RuntimeFailure, match="instance start failed"):
        run(start(spec(binary, image="/images/broken.sif"), scratch_root))
    assert list(scratch_root.iterdir()) == []


@pytest.mark.skipif(shutil.which("apptainer") is None, reason="no apptainer binary on PATH")
def test_real_apptainer(scratch_root: Path, tmp_path: Path) -> None:
    """An instance from POLAR_TEST_APPTAINER_IMAGE (default: the docker test image through docker-daemon://)."""
    image = os.environ.get("POLAR_TEST_APPTAINER_IMAGE", f"docker-daemon://{TEST_IMAGE}")

    async def body() -> None:
        async with await start(RuntimeSpec(backend="apptainer", image=image), scratch_root) as handle:
            result = await handle.exec(["sh", "-c", "echo $HOME $POLAR_SESSION_DIR; pwd; echo x > /polar/session/f"])
            assert result.ok, result.stderr
            assert result.stdout.split() == ["/polar/home", "/polar/session", "/polar/session"]
            assert (handle.session_dir / "f").read_text() == "x\n"
            timed = await handle.exec(["sleep", "300"], timeout=1.0)
            assert timed.timed_out

    run(body())
    assert list(scratch_root.iterdir()) == []
