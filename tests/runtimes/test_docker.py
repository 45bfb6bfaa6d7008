"""The docker runtime against a real Docker Engine and the local image from .ci/setup_docker.sh (nothing mocked)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import RuntimeContext
from polar_cli.models.task import Mount, PrepareAction, RuntimeSpec
from polar_cli.registry import get_runtime
from polar_cli.runtimes import start_session
from polar_cli.runtimes.docker import (
    LABEL_NODE,
    LABEL_OWNER,
    LABEL_RUNTIME,
    LABEL_SCRATCH,
    LABEL_SESSION,
    DockerHandle,
    DockerProcess,
)
from polar_cli.runtimes.gc import GcRule, collect_garbage
from polar_cli.runtimes.tools import ensure_node
from tests.runtimes.conftest import TEST_IMAGE, run, wait_for_file

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]


def spec(**fields: Any) -> RuntimeSpec:
    return RuntimeSpec(backend="docker", image=TEST_IMAGE, **fields)


async def start(
    scratch_root: Path, session_id: str = "d1", tools_dir: Path | None = None, node_id: str | None = None, **fields: Any
) -> DockerHandle:
    env = {"POLAR_GATEWAY_URL": "http://127.0.0.1:1/s"}
    context = RuntimeContext(session_id, env=env, tools_dir=tools_dir, scratch_root=scratch_root, node_id=node_id)
    handle = await get_runtime("docker").start(spec(**fields), context)
    assert isinstance(handle, DockerHandle)
    return handle


def container_exists(client: Any, container_id: str) -> bool:
    return any(c.id == container_id for c in client.containers.list(all=True, ignore_removed=True))


def test_exec_env_labels_limits_and_teardown(docker_engine: Any, scratch_root: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "given.txt").write_text("from a user mount")

    async def body() -> str:
        handle = await start(scratch_root, node_id="node-labels", env={"SPEC_VAR": "spec"}, cpus=0.5, memory="256m",
                             mounts=[Mount(source=str(extra), target="/data", read_only=True)])  # fmt: skip
        async with handle:
            result = await handle.exec(["sh", "-c", "env; pwd; cat /data/given.txt"], env={"CALL_VAR": "call"})
            assert result.ok, result.stderr
            lines = result.stdout.splitlines()
            env = dict(line.split("=", 1) for line in lines if "=" in line)
            assert env["HOME"] == "/polar/home" and env["POLAR_SESSION_DIR"] == "/polar/session"
            assert env["POLAR_GATEWAY_URL"] == "http://127.0.0.1:1/s"
            assert (env["SPEC_VAR"], env["CALL_VAR"]) == ("spec", "call")
            assert lines[-2:] == ["/polar/session", "from a user mount"]
            ro = await handle.exec(["touch", "/data/nope"])
            assert ro.exit_code != 0
            attrs = docker_engine.containers.get(handle.container.id).attrs
            assert attrs["HostConfig"]["NanoCpus"] == 500_000_000
            assert attrs["HostConfig"]["Memory"] == 256 * 1024 * 1024
            assert attrs["HostConfig"]["NetworkMode"] == "host"
            labels = attrs["Config"]["Labels"]
            assert labels[LABEL_SESSION] == "d1" and labels[LABEL_RUNTIME] == "docker"
            assert labels[LABEL_SCRATCH] == str(handle.scratch.root) and LABEL_OWNER in labels
            assert labels[LABEL_NODE] == "node-labels"
            # the bind mount works both ways
            await handle.exec(["sh", "-c", "echo from-container > /polar/session/out.txt"])
            assert (handle.session_dir / "out.txt").read_text() == "from-container\n"
            (handle.session_dir / "in.txt").write_text("from-host")
            assert (await handle.exec(["cat", "in.txt"])).stdout == "from-host"
            return str(handle.container.id)

    container_id = run(body())
    assert not container_exists(docker_engine, container_id)
    assert list(scratch_root.iterdir()) == []


@pytest.mark.parametrize("long_running", [False, True], ids=["served", "engine-exec"])
def test_timeout_kills_process_group_inside_container(scratch_root: Path, long_running: bool) -> None:
    async def body() -> None:
        async with await start(scratch_root) as handle:
            script = "sleep 300 & echo $! > /polar/session/child.pid; trap '' TERM; echo up; wait"
            result = await handle.exec(["sh", "-c", script], timeout=2.0, kill_grace=0.5, long_running=long_running)
            assert result.timed_out and result.stdout == "up\n"
            child = (handle.session_dir / "child.pid").read_text().strip()
            assert (await handle.exec(["test", "-e", f"/proc/{child}"])).exit_code == 1
            survivors = await handle.exec(["ps", "-eo", "args"])
            assert "sleep 300" not in survivors.stdout

    run(body())


def test_cancel_mid_run_leaves_no_container_process_or_directory(docker_engine: Any, scratch_root: Path) -> None:
    async def body() -> None:
        handle = await start(scratch_root)
        task = asyncio.create_task(handle.exec(["sh", "-c", "echo $$ > me.pid; sleep 300 & sleep 300"]))
        await wait_for_file(handle.session_dir / "me.pid")
        container_id = handle.container.id
        await handle.cancel()
        result = await asyncio.wait_for(task, 30)
        assert result.exit_code != 0
        assert not container_exists(docker_engine, container_id)
        assert not handle.scratch.root.exists()
        with pytest.raises(RuntimeFailure, match="already stopped"):
            await handle.exec(["true"])
        await handle.stop()

    run(body())
    assert list(scratch_root.iterdir()) == []
    leftovers = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_SESSION}=d1"}, ignore_removed=True)
    assert leftovers == []


@asynccontextmanager
async def host_server() -> AsyncIterator[int]:
    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"pong": request.headers.get("Authorization", "")})

    app = web.Application()
    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def test_node_through_tools_mount_reaches_a_gateway_on_host_loopback(scratch_root: Path, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    ensure_node(tools)
    js = (
        "fetch(process.env.GW + '/ping', {headers: {Authorization: 'Bearer ' + process.env.KEY}})"
        ".then(r => r.json()).then(j => console.log(process.version, j.pong))"
    )

    async def body() -> None:
        async with host_server() as port, await start(scratch_root, tools_dir=tools) as handle:
            assert handle.tools_path == "/polar/tools"
            env = {"GW": f"http://127.0.0.1:{port}", "KEY": "k-1"}
            result = await handle.exec(["node", "-e", js], env=env, timeout=60)
            assert result.ok, result.stderr
            version = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout.strip()
            assert result.stdout == f"{version} Bearer k-1\n"
            assert (await handle.exec(["sh", "-c", "command -v node"])).stdout == "/polar/tools/bin/node\n"
            assert (await handle.exec(["touch", "/polar/tools/x"])).exit_code != 0  # read-only

    run(body())


def test_files_inside_and_outside_the_session_dir(scratch_root: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "f.txt").write_text("tree")
    single = tmp_path / "one.txt"
    single.write_text("one")

    async def body() -> None:
        async with await start(scratch_root) as handle:
            await handle.upload(single, "/opt/polar/one.txt")  # outside any bind: staged, copied in the container
            await handle.upload(tree, "/opt/tree")
            await handle.upload(single, "in/one.txt")
            await handle.write_file("/usr/local/bin/hello", "#!/bin/sh\necho hello\n", mode=0o755)
            await handle.write_file("/polar/home/.cfg", "cfg")
            script = "cat /opt/polar/one.txt /opt/tree/a/f.txt in/one.txt ~/.cfg; hello"
            result = await handle.exec(["sh", "-c", script])
            assert result.stdout == "onetreeonecfghello\n"
            await handle.download("/opt/tree", tmp_path / "back")
            await handle.download("/usr/local/bin/hello", tmp_path / "hello")
            assert (tmp_path / "back" / "a" / "f.txt").read_text() == "tree"
            assert (tmp_path / "hello").read_text().endswith("echo hello\n")
            with pytest.raises(RuntimeFailure, match="download of /nope"):
                await handle.download("/nope", tmp_path / "nope")
            assert [p.name for p in handle.scratch.run.iterdir() if p.name.startswith("xfer")] == []

    run(body())


def test_prepare_actions_run_in_the_container(scratch_root: Path) -> None:
    prepare = [
        PrepareAction(type="write_file", path="/etc/polar-task", content="task-config"),
        PrepareAction(command="cat /etc/polar-task > copied.txt"),
    ]
    context = RuntimeContext("prep", scratch_root=scratch_root)

    async def body() -> None:
        async with await start_session(spec(prepare=prepare), context) as handle:
            assert (handle.session_dir / "copied.txt").read_text() == "task-config"

    run(body())


def test_bad_specs_and_missing_image(scratch_root: Path) -> None:
    context = RuntimeContext("bad", scratch_root=scratch_root)
    runtime = get_runtime("docker")
    with pytest.raises(ConfigError, match="needs 'image'"):
        run(runtime.start(RuntimeSpec(backend="docker"), context))
    with pytest.raises(ConfigError, match="unknown config"):
        run(runtime.start(spec(config={"privileged": True}), context))
    missing = RuntimeSpec(backend="docker", image="polar-no-such-image:1", config={"pull": "never"})
    with pytest.raises(RuntimeFailure, match="not present"):
        run(runtime.start(missing, context))
    assert not scratch_root.exists() or list(scratch_root.iterdir()) == []


def test_cleanup_removes_containers_of_dead_owners(docker_engine: Any, scratch_root: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    node = f"test-gc-{os.getpid()}"  # this test's own: the sweep touches no other test's containers
    labels = {LABEL_RUNTIME: "docker", LABEL_SESSION: "orphan", LABEL_NODE: node,
              LABEL_OWNER: f"{socket.gethostname()}:{finished.pid}"}  # fmt: skip
    orphan = docker_engine.containers.run(
        TEST_IMAGE, ["sleep", "infinity"], detach=True, init=True, network_mode="none", labels=labels
    )

    async def body() -> list[str]:
        async with await start(scratch_root, "alive", node_id=node) as live:
            rule = GcRule(node_id=node)
            report = await collect_garbage(rule, runtimes=["docker"], scratch_root=scratch_root)
            assert container_exists(docker_engine, live.container.id)  # its owner (this process) lives
            return [removal.leftover.name for removal in report.removed]

    removed = run(body())
    assert orphan.name in removed
    assert not container_exists(docker_engine, orphan.id)


def test_a_command_not_started_yet_has_no_exit_status(scratch_root: Path) -> None:
    """The engine answers ``Running: false`` without an ``ExitCode`` between ``exec create`` and the process start:
    wait() keeps waiting there (it used to answer 137), and returns the command's own status once it ran."""

    async def body() -> None:
        async with await start(scratch_root, session_id="not-started") as handle:
            api = handle.client.api
            created = await asyncio.to_thread(api.exec_create, handle.container.id, ["sh", "-c", "echo ran; exit 5"])
            process = DockerProcess(handle, created["Id"], handle.scratch.run / "unused.pid")
            waiting = asyncio.create_task(process.wait())
            await asyncio.sleep(0.5)  # several inspections of the created, not yet started exec
            assert not waiting.done(), waiting.result()
            process.pump(await asyncio.to_thread(api.exec_start, created["Id"], socket=True))
            assert await waiting == 5
            assert [chunk async for _, chunk in process.output()] == [b"ran\n"]

    run(body())
    assert list(scratch_root.iterdir()) == []


@pytest.mark.parametrize("long_running", [False, True], ids=["served", "engine-exec"])
def test_every_exec_reports_its_own_exit_status(scratch_root: Path, long_running: bool) -> None:
    """Many short commands, 16 at a time (POLAR_DOCKER_EXECS, default 400 served and 100 as engine execs, where the
    bug showed about once in 200-300): every status and output is the command's own, never 137 for a command that
    had not started yet."""
    commands = [(["true"], 0, ""), (["sh", "-c", "exit 3"], 3, ""), (["echo", "x"], 0, "x\n")]
    count = int(os.environ.get("POLAR_DOCKER_EXECS", "100" if long_running else "400"))

    async def body() -> list[tuple[int, int, str, str]]:
        async with await start(scratch_root, session_id="many-execs") as handle:
            gate = asyncio.Semaphore(16)

            async def one(i: int) -> tuple[int, int, str, str]:
                argv, _, _ = commands[i % len(commands)]
                async with gate:
                    result = await handle.exec(argv, timeout=120, long_running=long_running)
                return i, result.exit_code, result.stdout, result.stderr

            return await asyncio.gather(*(one(i) for i in range(count)))

    results = run(body())
    wrong = [(i, code, out, err) for i, code, out, err in results if (code, out) != commands[i % len(commands)][1:]]
    assert wrong == [], f"{len(wrong)} of {count} execs misreported, e.g. {wrong[:5]}"
    assert list(scratch_root.iterdir()) == []


def exec_ids(docker_engine: Any, handle: DockerHandle) -> list[str]:
    """The engine execs still running in the handle's container."""
    return docker_engine.api.inspect_container(handle.container.id).get("ExecIDs") or []


def test_short_commands_share_one_exec_server(docker_engine: Any, scratch_root: Path) -> None:
    """Concurrent commands run through one engine exec (the server), each with its own status, output, stdin, env,
    cwd and process group; a long-running command gets an engine exec of its own."""

    async def body() -> None:
        async with await start(scratch_root, session_id="served") as handle:
            script = 'read -r line; echo "$line $X $(pwd)"; echo err-$X >&2; sleep 1; exit "$X"'
            calls = [handle.exec(["sh", "-c", script], env={"X": str(i)}, cwd="/tmp" if i % 2 else None,
                                 stdin=f"in-{i}\n".encode(), timeout=60) for i in range(8)]  # fmt: skip
            running = asyncio.gather(*calls)
            await asyncio.sleep(0.5)
            assert len(exec_ids(docker_engine, handle)) == 1  # the server alone, whatever runs through it
            results = await running
            for i, result in enumerate(results):
                cwd = "/tmp" if i % 2 else "/polar/session"
                assert (result.exit_code, result.stdout, result.stderr) == (i, f"in-{i} {i} {cwd}\n", f"err-{i}\n")
            groups = await handle.exec(["sh", "-c", "echo $$; ps -o pgid= -p $$"])
            pid, pgid = groups.stdout.split()
            assert pid == pgid  # the command leads its own process group
            assert (await handle.exec(["no-such-command"])).exit_code == 127
            missing = await handle.exec(["true"], cwd="/no/such/dir")
            assert missing.exit_code == 126 and "/no/such/dir" in missing.stderr
            quoted = ["printf", "%s|", "a b", "$HOME", "'q'", "`id`", "-x", ""]
            assert (await handle.exec(quoted)).stdout == "a b|$HOME|'q'|`id`|-x||"
            server = handle._server
            long = asyncio.create_task(handle.exec(["sleep", "2"], long_running=True))
            await asyncio.sleep(0.5)
            assert len(exec_ids(docker_engine, handle)) == 2
            assert (await long).ok and handle._server is server

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_served_commands_are_killed_on_cancel_and_lost_with_the_server(docker_engine: Any, scratch_root: Path) -> None:
    """Cancelling an exec kills its group; a server killed from inside reports its commands as 137 and the next
    command starts a new one; a container that dies ends every command at once."""

    async def body() -> None:
        async with await start(scratch_root, session_id="lost") as handle:
            task = asyncio.create_task(handle.exec(["sh", "-c", "echo $$ > a.pid; sleep 300 & sleep 301"]))
            pid = await wait_for_file(handle.session_dir / "a.pid")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert "sleep 30" not in (await handle.exec(["ps", "-eo", "args"])).stdout
            assert (await handle.exec(["test", "-e", f"/proc/{pid}"])).exit_code == 1

            first = handle._server
            waiting = asyncio.create_task(handle.exec(["sleep", "300"], timeout=60))
            await asyncio.sleep(0.5)
            killer = await handle.exec(["pkill", "-KILL", "-f", "polar/run/server-"])
            assert killer.exit_code == 137  # its own server went with it
            assert (await asyncio.wait_for(waiting, 30)).exit_code == 137
            again = await handle.exec(["echo", "back"])
            assert again.stdout == "back\n" and handle._server is not first

            doomed = asyncio.create_task(handle.exec(["sleep", "300"], timeout=120))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(docker_engine.containers.get(handle.container.id).kill)
            assert (await asyncio.wait_for(doomed, 30)).exit_code == 137
            with pytest.raises(RuntimeFailure, match="not running"):
                await handle.exec(["true"])

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_a_served_command_that_stops_itself_runs_until_its_timeout(scratch_root: Path) -> None:
    """A stopped job ends bash's wait under job control: the server must not report it as exited (147)."""

    async def body() -> None:
        async with await start(scratch_root, session_id="stopped") as handle:
            result = await handle.exec(["sh", "-c", "exec >/dev/null 2>&1; kill -STOP $$; exit 3"], timeout=2)
            assert result.timed_out and result.exit_code != 147
            assert (await handle.exec(["echo", "still served"])).stdout == "still served\n"

    run(body())


def test_an_image_without_bash_gets_an_engine_exec_per_command(scratch_root: Path, tmp_path: Path) -> None:
    """The server needs bash: where the image has none (here: a non-executable file mounted over it), every command
    still runs, as an engine exec of its own."""
    not_bash = tmp_path / "not-bash"
    not_bash.write_text("")

    async def body() -> None:
        mounts = [Mount(source=str(not_bash), target="/usr/bin/bash", read_only=True)]
        async with await start(scratch_root, session_id="no-bash", mounts=mounts) as handle:
            result = await handle.exec(["sh", "-c", "echo $X; exit 4"], env={"X": "plain"}, stdin=b"")
            assert (result.exit_code, result.stdout) == (4, "plain\n")
            assert handle._server is None and handle._server_failure
            assert (await handle.exec(["sh", "-c", "cat"], stdin=b"fed")).stdout == "fed"

    run(body())
    assert list(scratch_root.iterdir()) == []
