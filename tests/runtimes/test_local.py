"""The local runtime, for real: host processes, process groups, mount namespaces and /proc checks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import RuntimeContext
from polar_cli.models.task import Mount, PrepareAction, RuntimeSpec
from polar_cli.registry import get_runtime
from polar_cli.runtimes import start_session
from polar_cli.runtimes.gc import GcRule, collect_garbage
from polar_cli.runtimes.local import LocalHandle, _marked_pids
from polar_cli.runtimes.scratch import OWNER_FILE
from tests.runtimes.conftest import gone, run, wait_for_file


async def start(scratch_root: Path, session_id: str = "s1", **spec: object) -> LocalHandle:
    context = RuntimeContext(session_id, env={"POLAR_GATEWAY_URL": "http://127.0.0.1:1/s"}, scratch_root=scratch_root)
    handle = await get_runtime("local").start(RuntimeSpec(**spec), context)
    assert isinstance(handle, LocalHandle)
    return handle


def test_registered_runtimes() -> None:
    assert {get_runtime(name).name for name in ("local", "docker", "apptainer")} == {"local", "docker", "apptainer"}


def test_two_sessions_cannot_see_each_others_files(scratch_root: Path) -> None:
    async def body() -> None:
        a = await start(scratch_root, "a")
        b = await start(scratch_root, "b")
        try:
            if a.isolation != "namespace":
                pytest.skip("mount namespaces unavailable here (unshare failed): only directory permissions isolate")
            await b.write_file("/polar/session/secret.txt", "b's secret")
            secret = b.session_dir / "secret.txt"
            seen = await a.exec(["cat", str(secret)])
            assert seen.exit_code != 0 and "b's secret" not in seen.stdout
            listing = await a.exec(["ls", "-a", str(scratch_root)])
            assert listing.ok
            assert listing.stdout.split() == [".", "..", a.scratch.root.name]  # b's dir does not even exist there
            found = await a.exec(["find", str(scratch_root), "-name", "secret.txt"])
            assert found.stdout == ""
            # b still sees its own file
            assert (await b.exec(["cat", "secret.txt"])).stdout == "b's secret"
        finally:
            await a.stop()
            await b.stop()

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_private_home_and_clean_environment(scratch_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_TEST_HOST_SECRET", "must-not-leak")

    async def body() -> None:
        async with await start(scratch_root, "a", env={"SPEC_VAR": "spec"}) as a, await start(scratch_root, "b") as b:
            result = await a.exec(["env"], env={"CALL_VAR": "call"})
            env = dict(line.split("=", 1) for line in result.stdout.splitlines())
            assert "POLAR_TEST_HOST_SECRET" not in env
            expected = {"PATH", "LANG", "TERM", "HOME", "TMPDIR", "POLAR_SESSION_ID", "POLAR_SESSION_DIR",
                        "POLAR_GATEWAY_URL", "SPEC_VAR", "CALL_VAR"}  # fmt: skip
            assert expected <= set(env) <= expected | {"PWD", "OLDPWD", "SHLVL"}  # the latter set by the wrapper sh
            assert env["HOME"] == a.home_path != b.home_path
            assert Path(env["HOME"]).parent == a.scratch.root
            assert env["POLAR_SESSION_DIR"] == a.session_path
            assert (env["SPEC_VAR"], env["CALL_VAR"], env["POLAR_SESSION_ID"]) == ("spec", "call", "a")
            assert (await a.exec(["pwd"])).stdout.strip() == a.session_path
            assert os.stat(a.scratch.root).st_mode & 0o777 == 0o700

    run(body())


def test_timeout_kills_the_whole_process_group(scratch_root: Path) -> None:
    async def body() -> None:
        async with await start(scratch_root) as handle:
            result = await handle.exec(
                ["sh", "-c", "sleep 300 & echo $! > grandchild.pid; echo started; wait"], timeout=2.0
            )
            assert result.timed_out and not result.ok
            assert result.stdout == "started\n"
            grandchild = int((handle.session_dir / "grandchild.pid").read_text())
            assert gone(grandchild)

    run(body())


def test_process_ignoring_sigterm_is_killed(scratch_root: Path) -> None:
    async def body() -> None:
        async with await start(scratch_root) as handle:
            script = "trap '' TERM; echo $$ > me.pid; while :; do sleep 0.1; done"
            result = await handle.exec(["sh", "-c", script], timeout=2.0, kill_grace=0.3)
            assert result.timed_out
            assert gone(int((handle.session_dir / "me.pid").read_text()))

    run(body())


def test_cancel_mid_run_leaves_no_process_and_no_directory(scratch_root: Path) -> None:
    async def body() -> None:
        handle = await start(scratch_root)
        script = "sleep 300 & echo $! > child.pid; setsid sleep 300 & echo $! > daemon.pid; sleep 300"
        task = asyncio.create_task(handle.exec(["sh", "-c", script], timeout=600))
        child = int(await wait_for_file(handle.session_dir / "child.pid"))
        daemon = int(await wait_for_file(handle.session_dir / "daemon.pid"))  # left the process group
        await handle.cancel()
        result = await task
        assert result.exit_code != 0
        assert gone(child) and gone(daemon)
        assert _marked_pids(f"POLAR_SESSION_DIR={handle.session_path}".encode()) == []
        assert not handle.scratch.root.exists()
        with pytest.raises(RuntimeFailure, match="already stopped"):
            await handle.exec(["true"])
        await handle.stop()  # idempotent

    run(body())
    assert list(scratch_root.iterdir()) == []


def test_cancelling_the_awaiting_task_kills_the_command(scratch_root: Path) -> None:
    async def body() -> None:
        async with await start(scratch_root) as handle:
            task = asyncio.create_task(handle.exec(["sh", "-c", "echo $$ > me.pid; exec sleep 300"]))
            pid = int(await wait_for_file(handle.session_dir / "me.pid"))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert gone(pid)

    run(body())


def test_stdin_output_streaming_and_missing_command(scratch_root: Path) -> None:
    async def body() -> None:
        async with await start(scratch_root) as handle:
            chunks: list[tuple[str, bytes]] = []
            argv = ["sh", "-c", "cat; echo oops >&2; exit 3"]
            result = await handle.exec(argv, stdin=b"from stdin\n", on_output=lambda s, c: chunks.append((s, c)))
            assert (result.exit_code, result.stdout, result.stderr) == (3, "from stdin\n", "oops\n")
            assert b"".join(c for s, c in chunks if s == "stdout") == b"from stdin\n"
            closed = await handle.exec(["cat"])  # stdin is closed, not inherited: cat ends at once
            assert closed.ok and closed.stdout == ""
            injected = await handle.exec(["echo", "$(touch pwned); rm -rf /"])
            assert injected.stdout == "$(touch pwned); rm -rf /\n" and not (handle.session_dir / "pwned").exists()
            missing = await handle.exec(["polar-no-such-command"])
            assert missing.exit_code != 0
            with pytest.raises(RuntimeFailure, match="list of strings"):
                await handle.exec("echo hi")  # type: ignore[arg-type]

    run(body())


def test_upload_download_write_file(scratch_root: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("tree file")
    single = tmp_path / "one.txt"
    single.write_text("single")

    async def body() -> None:
        async with await start(scratch_root) as handle:
            await handle.upload(single, "/polar/session/in/one.txt")
            await handle.upload(source, "tree")
            await handle.write_file("/polar/home/.config/x.json", '{"a": 1}', mode=0o600)
            await handle.write_file("bin/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
            assert (await handle.exec(["cat", "in/one.txt", "tree/sub/f.txt"])).stdout == "singletree file"
            assert (await handle.exec(["./bin/run.sh"])).stdout == "ran\n"
            config = Path(handle.home_path) / ".config" / "x.json"
            assert json.loads(config.read_text()) == {"a": 1} and config.stat().st_mode & 0o777 == 0o600
            await handle.exec(["sh", "-c", "mkdir -p out && echo result > out/r.txt"])
            await handle.download("/polar/session/out", tmp_path / "got")
            await handle.download(f"{handle.session_path}/out/r.txt", tmp_path / "r.txt")
            assert (tmp_path / "got" / "r.txt").read_text() == (tmp_path / "r.txt").read_text() == "result\n"
            with pytest.raises(RuntimeFailure, match="does not exist"):
                await handle.download("missing.txt", tmp_path / "x")

    run(body())


def test_prepare_actions_and_failure_cleanup(scratch_root: Path, tmp_path: Path) -> None:
    (tmp_path / "fixture.txt").write_text("uploaded")
    context = RuntimeContext("p", scratch_root=scratch_root)
    prepare = [
        PrepareAction(type="write_file", path="notes/a.txt", content="written"),
        PrepareAction(type="upload", source="fixture.txt"),
        PrepareAction(type="exec", command="cat notes/a.txt fixture.txt > both.txt"),
        PrepareAction(type="exec", command="pwd > where.txt", path="notes"),
    ]

    async def body() -> None:
        async with await start_session(RuntimeSpec(prepare=prepare), context, base_dir=tmp_path) as handle:
            assert (handle.session_dir / "both.txt").read_text() == "writtenuploaded"
            assert (handle.session_dir / "notes" / "where.txt").read_text().strip() == f"{handle.session_path}/notes"
        failing = [PrepareAction(command="echo broken >&2; exit 4")]
        with pytest.raises(RuntimeFailure, match=r"prepare\[0\] \(exec\) exited 4: broken"):
            await start_session(RuntimeSpec(prepare=failing), context)
        slow = [PrepareAction(command="sleep 30", timeout_seconds=0.3)]
        with pytest.raises(RuntimeFailure, match="timed out"):
            await start_session(RuntimeSpec(prepare=slow), context)
        with pytest.raises(ConfigError, match="needs 'command'"):
            await start_session(RuntimeSpec(prepare=[PrepareAction(type="exec")]), context)

    run(body())
    assert list(scratch_root.iterdir()) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (RuntimeSpec(image="debian"), "cannot honour image"),
        (RuntimeSpec(mounts=[Mount(source="/a", target="/b")]), "cannot honour mounts"),
        (RuntimeSpec(network="bridge"), "cannot honour network"),
        (RuntimeSpec(config={"nope": 1}), "unknown config nope"),
        (RuntimeSpec(config={"isolation": "chroot"}), "isolation must be one of"),
    ],
)
def test_spec_validation(spec: RuntimeSpec, message: str, scratch_root: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        run(get_runtime("local").start(spec, RuntimeContext("v", scratch_root=scratch_root)))


def test_isolation_none_still_private_dirs(scratch_root: Path) -> None:
    async def body() -> None:
        async with await start(scratch_root, config={"isolation": "none"}) as handle:
            assert handle.isolation == "none"
            assert (await handle.exec(["pwd"])).stdout.strip() == handle.session_path

    run(body())


def test_cleanup_removes_leftovers_of_dead_owners(scratch_root: Path) -> None:
    async def body() -> list[str]:
        live = await start(scratch_root, "live")
        dead = await start(scratch_root, "dead")
        # Pretend dead's owner process exited (as after a crash): its directory and processes are leftovers.
        child = subprocess.Popen(["true"])
        child.wait()
        owner_file = dead.scratch.root / OWNER_FILE
        owner = json.loads(owner_file.read_text())
        owner_file.write_text(json.dumps({**owner, "pid": child.pid}))
        task = asyncio.create_task(dead.exec(["sh", "-c", "echo $$ > me.pid; exec sleep 300"]))
        pid = int(await wait_for_file(dead.session_dir / "me.pid"))
        report = await collect_garbage(GcRule(), runtimes=["local"], scratch_root=scratch_root)
        removed = [removal.leftover.name for removal in report.removed]
        assert gone(pid)
        await task
        with contextlib.suppress(Exception):
            await dead.cancel()
        assert live.scratch.root.exists()
        await live.stop()
        return removed

    removed = run(body())
    assert len(removed) == 1 and "local-dead-" in removed[0]
    assert list(scratch_root.iterdir()) == []
