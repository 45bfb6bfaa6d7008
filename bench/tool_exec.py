"""Benchmark: what a command costs inside a sandbox, before and after the docker exec server (real Docker).

Both columns come from one run: "before" is the package as of ``--before`` (default ``main``; ``git archive`` of its
``polar_cli`` into a temporary folder), "after" is this checkout, each measured by this script in a subprocess of its
own against the same engine and image. Rows:

- ``exec true`` p50/p95: one ``handle.exec(["true"])`` round trip, sequential (``--execs`` of them);
- ``exec x8``: commands per second with 8 at a time;
- ``write_file`` outside the bind mounts (``/etc/...``), ``upload`` of a folder (``--files`` files, ``--megabytes``
  MB in all) into the session dir (a host copy) and to ``/opt`` (staged, then copied inside);
- ``shell tool``: what a harness's shell tool pays per command: node's ``spawnSync("bash", ["-c", "true"])`` inside
  the container, timed by node itself (``--commands`` of them). A harness runs its tool commands itself, inside its
  own process tree, so Polar's exec path is not on this path at all: both columns should agree;
- ``shell harness, between model calls``: ``polar run`` of the ``shell`` harness's reference agent in a container,
  scripted to call its bash tool ``--tool-calls`` times (``true``; at most 49, the agent stops at 50 turns) before
  answering: the gap between one model call's end and the next one's start in the journal (tool command, the agent's
  own loop, the HTTP call reaching the gateway), and the model call itself (the scripted backend);
- ``local exec true``: the local runtime's round trip, for comparison.

The machine's ceilings beside them: ``docker exec CID true`` from the CLI, the Engine API's exec create + start +
inspect, and a host fork+exec of ``true``.

    python bench/tool_exec.py [--before main] [--execs 200] [--commands 200] [--tool-calls 40] [--files 500]
        [--megabytes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

IMAGE = os.environ.get("POLAR_TEST_IMAGE", "polar-test-base:latest")
REPO = Path(__file__).resolve().parent.parent
SHELL_TOOL_JS = """
const { spawnSync } = require("node:child_process");
const n = Number(process.argv[1]); const times = [];
for (let i = 0; i < n; i++) {
  const t = process.hrtime.bigint();
  spawnSync("bash", ["-c", "true"], { stdio: ["ignore", "pipe", "pipe"] });
  times.push(Number(process.hrtime.bigint() - t) / 1e6);
}
console.log(JSON.stringify(times));
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    """Milliseconds of ``n`` sequential calls (after 3 unmeasured ones)."""
    for _ in range(3):
        await call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def make_tree(root: Path, files: int, megabytes: float) -> Path:
    tree = root / "tree"
    size = int(megabytes * 1024 * 1024 / files)
    for i in range(files):
        path = tree / f"d{i % 20}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return tree


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """This checkout's (or ``PYTHONPATH``'s) figures, as JSON-able numbers."""
    from polar_cli.interfaces.runtime import RuntimeContext
    from polar_cli.models.task import RuntimeSpec
    from polar_cli.registry import get_runtime
    from polar_cli.runtimes.tools import ensure_node

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polar-bench-exec-") as tmp:
        root = Path(tmp)
        tools = root / "tools"
        ensure_node(tools)
        tree = make_tree(root, args.files, args.megabytes)
        context = RuntimeContext("bench-exec", tools_dir=tools, scratch_root=root / "scratch")
        handle = await get_runtime("docker").start(RuntimeSpec(backend="docker", image=IMAGE), context)
        async with handle:

            async def true() -> None:
                assert (await handle.exec(["true"])).ok

            figures["exec"] = await timed(args.execs, true)
            started = time.perf_counter()
            gate = asyncio.Semaphore(8)

            async def gated() -> None:
                async with gate:
                    await true()

            await asyncio.gather(*(gated() for _ in range(args.execs)))
            figures["exec_x8_per_s"] = args.execs / (time.perf_counter() - started)
            counter = iter(range(10**6))
            figures["write_file"] = await timed(
                20, lambda: handle.write_file(f"/etc/polar-bench-{next(counter)}", "x", mode=0o600)
            )
            for name, target in (("upload_session", "in-session"), ("upload_opt", "/opt/tree")):
                started = time.perf_counter()
                await handle.upload(tree, target)
                figures[name] = time.perf_counter() - started
            tool = await handle.exec(["node", "-e", SHELL_TOOL_JS, str(args.commands)], timeout=600)
            assert tool.ok, tool.stderr
            figures["shell_tool"] = json.loads(tool.stdout)
        local = await get_runtime("local").start(RuntimeSpec(), RuntimeContext("bench-local", scratch_root=root))
        async with local:

            async def local_true() -> None:
                assert (await local.exec(["true"])).ok

            figures["local_exec"] = await timed(args.execs, local_true)
    return figures


def harness_gaps(code: Path, commands: int) -> dict[str, list[float]]:
    """Milliseconds between the reference agent's model calls, and of the calls, from ``polar run``'s journal."""
    import yaml

    from polar_cli.harnesses.shell import REFERENCE_AGENT, reference_agent_source

    call = {"function": {"name": "bash", "arguments": {"command": "true"}}}
    script = [{"content": None, "tool_calls": [call]} for _ in range(commands)] + [{"content": "done"}]
    task = {
        "instruction": f"run true {commands} times",
        "agent": {"harness": "shell", "config": {"command": f'exec node "$HOME/{REFERENCE_AGENT}"',
                                                 "files": {REFERENCE_AGENT: reference_agent_source()}}},
        "runtime": {"backend": "docker", "image": IMAGE},
        "builder": {"strategy": "per_request"},
        "evaluator": {"strategy": "session_completion"},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="polar-bench-run-") as tmp:
        root = Path(tmp)
        (root / "task.yaml").write_text(yaml.safe_dump(task))
        (root / "script.yaml").write_text(yaml.safe_dump(script))
        argv = [sys.executable, "-m", "polar_cli", "run", "task.yaml", "--script", "script.yaml", "--json",
                "--out", "out", "--data-dir", "data"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(code), "POLAR_LOAD_PLUGINS": ""}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=root)
        if done.returncode != 0:
            raise SystemExit(f"polar run with {code} failed:\n{done.stderr[-3000:]}")
        journal = next((root / "data" / "journal").glob("*.jsonl"))
        rows = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    gaps = [(b["started_at"] - a["finished_at"]) * 1000 for a, b in itertools.pairwise(rows)]
    return {"gap": gaps, "call": [(r["finished_at"] - r["started_at"]) * 1000 for r in rows]}


def ceilings(n: int) -> dict[str, list[float]]:
    """The machine's own floor: docker exec from the CLI, the Engine API's exec, a host fork+exec."""
    import docker

    container = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", "--label", "polar.bench=tool_exec", IMAGE,
         "sleep", "infinity"], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    client = docker.from_env()
    try:
        figures: dict[str, list[float]] = {"cli": [], "api": [], "fork": []}
        for _ in range(n):
            started = time.perf_counter()
            subprocess.run(["docker", "exec", container, "true"], check=True)
            figures["cli"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            created = client.api.exec_create(container, ["true"])
            client.api.exec_start(created["Id"])
            client.api.exec_inspect(created["Id"])
            figures["api"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            subprocess.run(["true"], check=True)
            figures["fork"].append((time.perf_counter() - started) * 1000)
        return figures
    finally:
        client.close()
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def run_measure(args: argparse.Namespace, code: Path) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--measure", "--execs", str(args.execs), "--commands", str(args.commands),
            "--files", str(args.files), "--megabytes", str(args.megabytes)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "POLAR_LOAD_PLUGINS": ""}  # built-in runtimes only
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=code)
    if done.returncode != 0:
        raise SystemExit(f"measuring {code} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="main", help="git revision for the 'before' column")
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--tool-calls", type=int, default=40, choices=range(1, 50), metavar="1..49")
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--megabytes", type=float, default=20.0)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(asyncio.run(measure(args))))
        return

    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory(prefix="polar-bench-before-") as before_dir:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "polar_cli"],
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", before_dir], input=archive, check=True)
        before = run_measure(args, Path(before_dir))
        before |= harness_gaps(Path(before_dir), args.tool_calls)
    after = run_measure(args, REPO) | harness_gaps(REPO, args.tool_calls)
    floor = ceilings(min(args.execs, 50))

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} / {percentile(values, 0.95):.1f} ms"

    table = Table(title=f"tool execution in a {IMAGE} container (p50 / p95; before = {args.before})")
    for column in ("", "before", "after", "ceiling"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("exec true", ms(before["exec"]), ms(after["exec"]),
                  f"docker exec CLI {ms(floor['cli'])}; API {ms(floor['api'])}")  # fmt: skip
    table.add_row("exec, 8 at a time", f"{before['exec_x8_per_s']:.0f}/s", f"{after['exec_x8_per_s']:.0f}/s", "")
    table.add_row("write_file /etc/...", ms(before["write_file"]), ms(after["write_file"]), "")
    size = f"{args.files} files, {args.megabytes:g} MB"
    for key, what in (("upload_session", "into /polar/session"), ("upload_opt", "to /opt")):
        table.add_row(f"upload {size} {what}", f"{before[key]:.2f} s", f"{after[key]:.2f} s", "")
    table.add_row("shell tool per command (in the harness)", ms(before["shell_tool"]), ms(after["shell_tool"]),
                  f"host fork+exec {ms(floor['fork'])}")  # fmt: skip
    table.add_row("shell harness: between model calls", ms(before["gap"]), ms(after["gap"]), "")
    table.add_row("shell harness: model call (scripted)", ms(before["call"]), ms(after["call"]), "")
    table.add_row("local runtime exec true", ms(before["local_exec"]), ms(after["local_exec"]), "")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
