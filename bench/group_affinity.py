"""Benchmark: group-affine routing in the inference pool (docs/proxy.md, Inference pool): prefill tokens the replicas
compute with and without ``proxy.pool.group_affinity``.

Two vLLM CPU servers (the venv of .ci/setup_vllm.sh, $POLAR_VLLM_VENV) serve the demo model (random weights,
``polar_cli/demo_model.py``) with prefix caching on, as the pool's two replicas of a real ``polar serve`` (its own
process, ``--backend vllm --backend-url A --backend-url B``). A run submits ``--groups`` tasks of ``--samples``
samples each, all at once; each task's instruction is its own ``--prompt-words`` random words (a few thousand
tokens), shared by its samples, as the prompt of a GRPO group is. Each sample is a shell-harness agent making
``--calls`` chat calls (the history so far, ``--max-tokens`` sampled at temperature 1). The runs alternate affinity on
(the default margin) and off, ``--rounds`` times, each with new instructions and the servers' prefix caches reset
(``POST /reset_prefix_cache``, dev mode) before it.

From each server's ``/metrics``, before and after a run, summed over both servers: prompt tokens
(``vllm:prompt_tokens``), those computed (``vllm:prompt_tokens_by_source{source="local_compute"}``, the prefill work)
and those served from the prefix cache (``source="local_cache_hit"``); from the gateway's journals, how many replicas
each group's samples sampled on, and from the gateway's ``polar_inference_group_placements_total`` how many sessions
spilled over from their group's first replica. Printed as one table, a row per run.

    flock /tmp/polar-heavy.lock python bench/group_affinity.py [--groups 4] [--samples 8] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from procs import free_port, stop, vllm_python
from rich.console import Console
from rich.table import Table

from polar_cli.client import PolarClient
from polar_cli.proxy import read_journal

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "polar-demo"
SOURCES = ("local_compute", "local_cache_hit")
# The harness: CALLS chat calls through the session's proxy, each with the history so far.
AGENT = """
import json, os, urllib.request
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
for turn in range(int(os.environ["CALLS"])):
    body = {"model": os.environ["POLAR_MODEL"], "messages": messages, "max_tokens": int(os.environ["MAX_TOKENS"]),
            "temperature": 1.0}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    answer = json.load(urllib.request.urlopen(request, timeout=300))
    messages += [{"role": "assistant", "content": answer["choices"][0]["message"].get("content") or ""},
                 {"role": "user", "content": "go on"}]
print("done")
"""


def wait_until(ready: Any, proc: subprocess.Popen[bytes], log: Path, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with_answer = ready()
        if with_answer:
            return with_answer
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def vllm_servers(model_dir: Path, work: Path, count: int) -> Iterator[list[str]]:
    """``count`` vLLM servers of the demo model, started together (as tests/support/vllm.py starts them), with prefix
    caching on; their base URLs."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    started: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        for n in range(count):
            port, log = free_port(), work / f"vllm-{n}.log"
            argv = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                    "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
                    "--max-model-len", "8192", "--dtype", "float32", "--seed", "0", "--enforce-eager",
                    "--enable-prefix-caching"]  # fmt: skip
            with open(log, "ab") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=model_dir,
                                        start_new_session=True)  # fmt: skip
            started.append((f"http://127.0.0.1:{port}", proc, log))
        startup_s = float(os.environ.get("POLAR_VLLM_STARTUP_S", "300"))
        for url, proc, log in started:
            wait_until(lambda url=url: answers(f"{url}/v1/models"), proc, log, f"vLLM at {url}", startup_s)
        yield [url for url, _, _ in started]
    finally:
        for _, proc, _ in started:
            stop(proc)


@contextmanager
def polar_serve(work: Path, urls: list[str], pool: dict[str, Any], slots: int) -> Iterator[dict[str, Any]]:
    """A real ``polar serve`` (its own process) over the replicas ``urls``; its ``serve.json``."""
    data_dir = work / "polar-data"
    data_dir.mkdir(parents=True)
    config = work / "serve.yaml"
    pipeline = {"init_workers": 4, "run_slots": slots, "postrun_workers": 4}
    gateway = {"scratch_root": str(work / "scratch"), "pipeline": pipeline,
               "proxy": {"pool": pool}}  # fmt: skip
    config.write_text(yaml.safe_dump({"gateway": gateway}))
    backends = [arg for url in urls for arg in ("--backend-url", url)]
    argv = [sys.executable, "-m", "polar_cli", "serve", "--data-dir", str(data_dir), "--port", "0", "--config",
            str(config), "--backend", "vllm", *backends, "--model", MODEL_NAME]  # fmt: skip
    log = work / "serve.log"
    # built-in plugins only (the shell harness is all it runs): a broken plugin installed beside it cannot stop it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "POLAR_LOAD_PLUGINS": ""}  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def info() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((data_dir / "serve.json").read_text())
        except (OSError, ValueError):
            return None
        return found if found.get("pid") == proc.pid else None

    try:
        yield wait_until(info, proc, log, "polar serve", 120)
    finally:
        stop(proc)


def spilled(info: dict[str, Any]) -> int:
    """New sessions the gateway's pool spilled over from their group's first replica (its metrics)."""
    headers = {"Authorization": f"Bearer {info['node_token']}"}
    text = httpx.get(f"{info['gateway_url']}/metrics", headers=headers, timeout=30).text
    name = 'polar_inference_group_placements_total{placed="spilled"}'
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines() if line.startswith(name))


def counters(url: str) -> dict[str, float]:
    """vLLM's prompt-token counters on ``url``: total, and per source (computed, from the prefix cache)."""
    found = dict.fromkeys(("total", *SOURCES), 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            found["total"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prompt_tokens_by_source_total"):
            source = re.search(r'source="([^"]+)"', line)
            if source and source.group(1) in found:
                found[source.group(1)] += float(line.rsplit(" ", 1)[1])
    return found


def instruction(rng: random.Random, words: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(words))
    return f"Summarize this text: {text}"


def task(task_id: str, text: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": text,
        "num_samples": args.samples,
        "timeout_seconds": 600,
        "agent": {
            "harness": "shell",
            "env": {"CALLS": str(args.calls), "MAX_TOKENS": str(args.max_tokens)},
            "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
        },
        "builder": {"strategy": "per_request"},
    }


@dataclass
class Row:
    run: str
    affinity: bool
    calls: int
    prompt: float
    computed: float
    cached: float
    per_group: float
    """Replicas a group's samples sampled on, mean over the groups."""
    spilled: int
    wall_s: float


def one_run(run: int, urls: list[str], affinity: bool, args: argparse.Namespace, rng: random.Random) -> Row:
    for url in urls:
        httpx.post(f"{url}/reset_prefix_cache", timeout=60).raise_for_status()
    before = [counters(url) for url in urls]
    pool: dict[str, Any] = {"group_affinity": affinity, "affinity_margin": args.margin}
    with tempfile.TemporaryDirectory(prefix="polar-affinity-") as tmp, \
            polar_serve(Path(tmp), urls, pool, args.groups * args.samples) as info:  # fmt: skip
        began = time.monotonic()
        with PolarClient(info["url"], info["token"], timeout=60) as client:
            ids = [f"r{run}-g{g}" for g in range(args.groups)]
            for task_id in ids:
                client.submit(task(task_id, instruction(rng, args.prompt_words), args))
            replicas: list[int] = []
            calls = 0
            for task_id in ids:
                status = client.wait(task_id, timeout=600)
                failed = [r for r in status.results if r.status != "completed"]
                if status.state != "completed" or failed:
                    raise SystemExit(f"task {task_id} did not complete: {status.state} {failed[:1]}")
                journal = Path(tmp) / "polar-data" / "journal"
                done = [c for s in status.sessions for c in read_journal(journal / f"{s}.jsonl")]
                calls += len(done)
                replicas.append(len({c.replica for c in done}))
        wall_s = time.monotonic() - began
        spills = spilled(info)
    after = [counters(url) for url in urls]
    delta = {key: sum(a[key] - b[key] for a, b in zip(after, before, strict=True)) for key in before[0]}
    return Row(f"{run + 1}", affinity, calls, delta["total"], delta["local_compute"], delta["local_cache_hit"],
               sum(replicas) / len(replicas), spills, wall_s)  # fmt: skip


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    table = Table(title=f"Group affinity: {args.groups} groups x {args.samples} samples x {args.calls} calls, "
                        f"2 vLLM CPU replicas, ~{args.prompt_words} words of shared prompt per group, "
                        f"margin {args.margin}")  # fmt: skip
    for name in ("run", "affinity", "calls", "prompt tokens", "prefill computed", "from prefix cache",
                 "computed / prompt", "replicas per group", "sessions spilled", "wall s"):  # fmt: skip
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(row.run, "on" if row.affinity else "off", str(row.calls), f"{row.prompt:,.0f}",
                      f"{row.computed:,.0f}", f"{row.cached:,.0f}", f"{row.computed / max(row.prompt, 1):.1%}",
                      f"{row.per_group:.2f}", str(row.spilled), f"{row.wall_s:.1f}")  # fmt: skip
    Console(width=150).print(table)
    mean = {on: sum(r.computed for r in rows if r.affinity is on) / (len(rows) / 2) for on in (True, False)}
    fewer = f" ({1 - mean[True] / mean[False]:.0%} fewer with it)" if mean[False] else ""
    print(f"prefill tokens computed per run (mean): {mean[True]:,.0f} with affinity, {mean[False]:,.0f} without{fewer}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4, help="tasks per run")
    parser.add_argument("--samples", type=int, default=8, help="samples per task (the group size)")
    parser.add_argument("--calls", type=int, default=2, help="chat calls per sample")
    parser.add_argument("--prompt-words", type=int, default=600, help="random words in each group's instruction")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--margin", type=int, default=8, help="proxy.pool.affinity_margin (8: the default)")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs (affinity on, then off)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polar-affinity-bench-")))
        model_dir = work / "model"
        subprocess.run([str(vllm_python()), "-P", str(ROOT / "polar_cli" / "demo_model.py"), "model", str(model_dir)],
                       check=True, capture_output=True)  # fmt: skip
        urls = stack.enter_context(vllm_servers(model_dir, work, 2))
        rows = []
        for run in range(2 * args.rounds):
            rows.append(one_run(run, urls, affinity=run % 2 == 0, args=args, rng=rng))
            print(f"run {run + 1}: {rows[-1]}", flush=True)
    print_table(rows, args)


if __name__ == "__main__":
    main()
