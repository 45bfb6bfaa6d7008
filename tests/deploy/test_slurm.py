"""deploy/slurm on a real Slurm: slurmctld and slurmd on loopback (one node, a config written here; munged from
.ci/setup_slurm.sh), the documented server and gateway jobs submitted with sbatch (only paths and test settings in
their environment), the shell harness with the scripted backend."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polar_cli.registry import LOAD_ENV
from tests.server.procs import REPO, client, free_port, gateway_metrics, serve_config, until_true, waiting_task
from tests.server.test_service import finished, one_result_per_sample

DEPLOY = REPO / "deploy" / "slurm"
DRAIN_S = 5
KILL_WAIT_S = 30


def _unavailable() -> str | None:
    """The reason .ci/setup_slurm.sh recorded for not getting Slurm, if it did."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    marker = Path(os.environ.get("POLAR_SLURM_UNAVAILABLE") or cache / "polar" / "slurm-unavailable")
    return marker.read_text().strip() if marker.is_file() else None


def _skip_or_fail(reason: str) -> None:
    recorded = _unavailable()
    if recorded:
        pytest.skip(f"no Slurm here: {recorded}")
    if os.environ.get("CI"):  # the setup script ran and reported Slurm: not getting it to run is a failure
        pytest.fail(reason)
    pytest.skip(reason)


def slurm_conf(root: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=polartest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",  # the node below claims more CPUs than this host has: jobs share them
        "ReturnToService=2",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        f"KillWait={KILL_WAIT_S}",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs=32 RealMemory=1000 State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"  # fmt: skip


@dataclass
class Slurm:
    root: Path
    env: dict[str, str]

    def run(self, *argv: str) -> str:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=True, timeout=60).stdout

    def sbatch(self, script: Path, name: str, *options: str, **settings: str) -> str:
        """Submit ``script`` as it is; only its environment (paths, test settings), its log's path and ``options``
        are ours."""
        env = {**self.env, **settings}
        argv = ["sbatch", "--parsable", f"--output={self.root / name}-%j.out", *options, str(script)]
        out = subprocess.run(argv, env=env, cwd=self.root, capture_output=True, text=True, check=True, timeout=60)
        return out.stdout.strip().split(";")[0]

    def jobs(self) -> dict[str, str]:
        """Each job's state, as squeue shows it."""
        lines = self.run("squeue", "-h", "-o", "%i %T").split("\n")
        return dict(line.split() for line in lines if line.strip())

    def log(self, name: str, job: str) -> str:
        path = self.root / f"{name}-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    found = [tool for tool in ("slurmctld", "slurmd", "sbatch", "munge") if shutil.which(tool, path=_sbin_path())]
    if len(found) != 4 or os.geteuid() != 0:
        _skip_or_fail("slurmctld, slurmd, sbatch and munge are needed, run as root: run .ci/setup_slurm.sh")
    munge = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, timeout=30)
    if munge.returncode != 0:
        _skip_or_fail(f"munged does not answer ({munge.stderr.decode()[-200:]}): run .ci/setup_slurm.sh")
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, socket.gethostname()))
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": _sbin_path(), LOAD_ENV: "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    daemons = []
    for daemon in ("slurmctld", "slurmd"):
        with (root / f"{daemon}.err").open("w") as err:
            daemons.append(subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, start_new_session=True,
                                            stdout=subprocess.DEVNULL, stderr=err))  # fmt: skip
    cluster = Slurm(root, env)
    try:
        end = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout:
            if time.monotonic() > end or any(d.poll() is not None for d in daemons):
                logs = "".join(p.read_text()[-1500:] for p in root.glob("slurm*.log"))
                pytest.fail(f"slurmctld and slurmd did not bring the node up: {logs}")
            time.sleep(0.5)
        yield cluster
    finally:
        subprocess.run(["scancel", "--signal=KILL", "--full", *cluster_jobs(env)], env=env, capture_output=True)
        for daemon in daemons:
            daemon.terminate()
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def cluster_jobs(env: dict[str, str]) -> list[str]:
    listed = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    return listed.split() or ["0"]


def _sbin_path() -> str:
    path = os.environ.get("PATH", "")
    return os.pathsep.join([path, "/usr/sbin", "/sbin"])


def settings(slurm: Slurm, name: str) -> dict[str, str]:
    """The jobs' environment: where things go (paths, under ``name``), fast heartbeats, a short drain."""
    config = serve_config(slurm.root, "serve", server={"heartbeat_interval_s": 1.0})
    return {
        "POLAR_SHARED": str(slurm.root / name / "shared"),
        "POLAR_GATEWAY_DATA": str(slurm.root / name / "gateways"),
        "POLAR_PORT": "0",
        "POLAR_SERVER_ARGS": f"--config {config}",
        "POLAR_GATEWAY_ARGS": f"--config {config}",
        "POLAR_DRAIN_TIMEOUT": str(DRAIN_S),
    }


async def status(info: dict[str, Any]) -> dict[str, Any]:
    async with client(info) as http:
        return dict((await http.get("/rollout/status")).json())


def test_the_documented_jobs_run_a_task_and_a_scancelled_gateway_hands_its_sessions_back(
    slurm: Slurm, tmp_path: Path
) -> None:
    env = settings(slurm, "scancel")
    server_job = slurm.sbatch(DEPLOY / "polar-server.sbatch", "server", **env)
    gateway_jobs = [slurm.sbatch(DEPLOY / "polar-gateways.sbatch", "gateways", **env) for _ in range(2)]
    marker = tmp_path / "go"

    async def body() -> None:
        info, nodes = await registered(slurm, env, server_job, gateway_jobs)
        assert {n["placement"]["scheduler"] for n in nodes} == {"slurm"}
        assert {n["placement"]["step_id"] for n in nodes} == {"0"}  # srun's step
        by_job = {n["placement"]["job_id"]: n for n in nodes}

        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("sixteen", 16))
        results = one_result_per_sample(await finished(info, "sixteen"), 16)
        assert {r.metadata["node_id"] for r in results} == {n["node_id"] for n in nodes}  # across both jobs

        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("cancelled-job", 6, marker))
        tokens = {job: _node_token(env, job) for job in gateway_jobs}

        async def both_running() -> bool:
            loads = [await gateway_metrics(by_job[job]["url"], tokens[job]) for job in gateway_jobs]
            return all(m["stages"]["running"]["in_flight"] == 3 for m in loads)

        await until_true(both_running, "three sessions running in each gateway job")
        cancelled, staying = gateway_jobs
        slurm.run("scancel", cancelled)
        await until_true(lambda: asyncio.sleep(0, cancelled not in slurm.jobs()), "the cancelled job to end", 120)
        said = slurm.log("gateways", cancelled)
        assert "Drained: 0 sessions finished here; 3 handed back to the server" in said, said
        handed = said.split("to run again elsewhere): ")[1].split()[:3]
        marker.touch()
        results = one_result_per_sample(await finished(info, "cancelled-job"), 6)  # each session ended exactly once
        assert {r.metadata["node_id"] for r in results} == {by_job[staying]["node_id"]}
        attempts = {r.session_id: r.metadata["polar_attempt"] for r in results}
        assert sorted(attempts[sid] for sid in handed) == [2, 2, 2]
        assert sorted(attempts.values()) == [1, 1, 1, 2, 2, 2]

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        end_jobs(slurm, [*gateway_jobs, server_job])


def _node_token(env: dict[str, str], job: str) -> str:
    """The node token of the job's gateway, from its serve.json (mode 0600, in its data dir)."""
    found = list((Path(env["POLAR_GATEWAY_DATA"]) / job).glob("*/serve.json"))
    assert len(found) == 1, found
    return str(json.loads(found[0].read_text())["node_token"])


async def registered(
    slurm: Slurm, env: dict[str, str], server_job: str, gateway_jobs: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The server's address from its connect file, once a gateway of each job has registered (and its nodes)."""
    connect = Path(env["POLAR_SHARED"]) / "polar-server.json"
    await until_true(lambda: asyncio.sleep(0, connect.exists()), "the server's connect file", within=120)
    address = json.loads(connect.read_text())
    assert connect.stat().st_mode & 0o777 == 0o600
    info = {"url": address["url"], "token": address["token"]}
    for job in [server_job, *gateway_jobs]:  # the token is in no job's command line, nor in the server's log
        assert address["token"] not in slurm.run("scontrol", "show", "job", job)
    assert address["token"] not in slurm.log("server", server_job)

    async def all_registered() -> list[dict[str, Any]]:
        nodes = (await status(info))["nodes"]
        jobs = sorted((n.get("placement") or {}).get("job_id") for n in nodes)
        return nodes if jobs == sorted(gateway_jobs) else []

    return info, await until_true(all_registered, "a gateway of each job registered", within=120)


def test_a_gateway_job_at_its_time_limit_drains_and_hands_its_sessions_back(slurm: Slurm, tmp_path: Path) -> None:
    """The script's own --signal=B:TERM@N, with the time limit and lead made short (sbatch options win over the
    script's #SBATCH lines): the warning reaches the batch script, which passes SIGTERM on to its gateway."""
    env = settings(slurm, "time-limit")
    server_job = slurm.sbatch(DEPLOY / "polar-server.sbatch", "server", **env)
    staying = slurm.sbatch(DEPLOY / "polar-gateways.sbatch", "gateways", **env)
    limited = slurm.sbatch(DEPLOY / "polar-gateways.sbatch", "gateways", "--time=3", "--signal=B:TERM@150", **env)
    marker = tmp_path / "go"

    async def body() -> None:
        info, nodes = await registered(slurm, env, server_job, [staying, limited])
        by_job = {n["placement"]["job_id"]: n for n in nodes}
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("time-limit", 6, marker))
        token = _node_token(env, limited)
        await until_true(lambda: running(by_job[limited]["url"], token, 3), "three sessions in the limited job")
        await until_true(lambda: asyncio.sleep(0, limited not in slurm.jobs()), "the warned job to end", 150)
        said = slurm.log("gateways", limited)
        assert "polar-gateways: SIGTERM: the gateways drain" in said, said
        assert "3 handed back to the server" in said, said
        handed = said.split("to run again elsewhere): ")[1].split()[:3]
        marker.touch()
        results = one_result_per_sample(await finished(info, "time-limit"), 6)  # each session ended exactly once
        assert {r.metadata["node_id"] for r in results} == {by_job[staying]["node_id"]}
        attempts = {r.session_id: r.metadata["polar_attempt"] for r in results}
        assert sorted(attempts[sid] for sid in handed) == [2, 2, 2]

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        end_jobs(slurm, [staying, limited, server_job])


async def running(url: str, token: str, count: int) -> bool:
    return bool((await gateway_metrics(url, token))["stages"]["running"]["in_flight"] == count)


def end_jobs(slurm: Slurm, jobs: list[str]) -> None:
    for job in jobs:
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True)
    end = time.monotonic() + KILL_WAIT_S + 30
    while slurm.jobs() and time.monotonic() < end:
        time.sleep(0.5)
