"""deploy/kubernetes on paper (no cluster here): every manifest passes ``kubernetes-validate`` (strict: a misspelled
field fails) for current Kubernetes releases, the docs show the files as they are, and what the manifests promise
holds against the real CLI: each container's ``polar serve`` arguments parse, the token reaches the pods from the
Secret and never on a command line, the probes ask ``/healthz`` on the port the process binds, the volume is the
data dir, and a gateway's grace period covers its drain. The gateway's preStop hook runs for real: ``polar serve`` as
process 1 of a PID namespace (the container's), the hook's command in that namespace."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from polar_cli.cli import build_app
from polar_cli.gateway.agent import HAND_BACK_S
from tests.deploy.test_slurm import running
from tests.server.procs import REPO, Serve, client, free_port, serve_config, until_true, waiting_task
from tests.server.test_service import finished, one_result_per_sample
from tests.support.docs import ROOT, code_blocks, parse

KUBERNETES = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
VERSIONS = ("1.33", "1.37")
"""The oldest release the manifests promise (native sidecars, mentioned in the docs, are GA from 1.33) and the
newest kubernetes-validate has schemas for."""
EXIT_MARGIN_S = 5
"""Seconds a gateway needs after its hand-back to stop its listeners and exit."""


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def resource(kind: str, name: str) -> dict[str, Any]:
    found = [d for p in MANIFESTS for d in documents(p) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/kubernetes, found {len(found)}"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def serve_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The container's ``polar serve`` options as the real CLI parses them ($(VAR) as the kubelet expands it)."""
    assert spec["command"][:2] == ["polar", "serve"], "polar itself is the container's process (the preStop's pid 1)"
    args = [a.replace("$(POD_IP)", "10.0.0.7") for a in spec["command"][2:] + spec.get("args", [])]
    return dict(parse(typer.main.get_command(build_app()), ["serve", *args]).params)


def test_there_are_manifests_for_the_server_and_the_gateways() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for p in MANIFESTS for d in documents(p)}
    assert kinds >= {("Service", "polar-server"), ("StatefulSet", "polar-server"), ("Deployment", "polar-gateway")}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_every_manifest_validates_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    for doc in documents(path):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata']['name']} (Kubernetes {version}): {exc}")


def test_the_validation_rejects_a_misspelled_field() -> None:
    """A pass above means something: strict validation refuses a field Kubernetes does not have."""
    gateway = copy.deepcopy(resource("Deployment", "polar-gateway"))
    pod = gateway["spec"]["template"]["spec"]
    pod["terminationGracePeriod"] = pod.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(gateway, VERSIONS[-1], strict=True)


def test_the_docs_show_each_manifest_as_it_is() -> None:
    shown = [b.text for b in code_blocks(ROOT / "docs" / "deploy.md") if b.language == "yaml"]
    for path in MANIFESTS:
        assert path.read_text() in shown, f"docs/deploy.md does not show {path.relative_to(ROOT)} as it is"


TOKEN_ENV = [("StatefulSet", "polar-server", "POLAR_TOKEN"), ("Deployment", "polar-gateway", "POLAR_SERVER_TOKEN")]


@pytest.mark.parametrize(("kind", "name", "token_env"), TOKEN_ENV)
def test_the_token_comes_from_the_secret_never_a_command_line(kind: str, name: str, token_env: str) -> None:
    spec = container(resource(kind, name))
    line = spec["command"] + spec.get("args", [])
    assert not {"--token", "--server-token"} & set(line), f"{name}: a token option on the command line: {line}"
    env = {e["name"]: e for e in spec["env"]}
    assert env[token_env]["valueFrom"]["secretKeyRef"] == {"name": "polar-server-token", "key": "token"}
    assert "value" not in env[token_env]


@pytest.mark.parametrize(("kind", "name"), [("StatefulSet", "polar-server"), ("Deployment", "polar-gateway")])
def test_the_probes_and_the_volume_match_what_polar_serve_is_told(kind: str, name: str) -> None:
    workload = resource(kind, name)
    spec = container(workload)
    params = serve_params(spec)
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    probe = spec["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == params["port"], "the readiness probe asks another port than the one it binds"
    assert params["host"] == "0.0.0.0"
    mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
    assert mounts.get(str(params["data_dir"])), f"{name}: --data-dir {params['data_dir']} is on no volume"


def test_the_server_keeps_its_state_on_a_claim_and_runs_once() -> None:
    server = resource("StatefulSet", "polar-server")
    assert server["spec"]["replicas"] == 1, "one polar serve per data dir"
    claims = {c["metadata"]["name"] for c in server["spec"]["volumeClaimTemplates"]}
    data_dir = str(serve_params(container(server))["data_dir"])
    assert {m["name"] for m in container(server)["volumeMounts"] if m["mountPath"] == data_dir} <= claims
    service = resource("Service", "polar-server")
    assert service["spec"]["selector"] == server["spec"]["template"]["metadata"]["labels"]
    gateway = serve_params(container(resource("Deployment", "polar-gateway")))
    assert gateway["server"] == f"http://polar-server:{service['spec']['ports'][0]['port']}"


def test_the_gateway_grace_period_covers_its_drain() -> None:
    """The preStop hook starts the drain and holds the kubelet's SIGTERM until the gateway exits; the grace period
    bounds both: the drain's wait, the hand-back's, and the exit must fit in it."""
    gateway = resource("Deployment", "polar-gateway")
    spec = container(gateway)
    params = serve_params(spec)
    assert params["role"] == "gateway" and params["drain_timeout"] > 0
    grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= params["drain_timeout"] + HAND_BACK_S + EXIT_MARGIN_S
    hook = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and "kill -TERM 1" in hook[2] and "while kill -0 1" in hook[2]
    assert params["public_url"] == "http://10.0.0.7"  # its pod IP: the server calls each gateway directly


def _expand(value: str, env: dict[str, str]) -> str:
    """``$(NAME)`` in a container's command and args, as the kubelet expands it from the container's environment."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _child(pid: int) -> int:
    """The one child of ``pid`` (``unshare --fork``'s: process 1 of the new PID namespace)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


NAMESPACES = os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("nsenter"))


@pytest.mark.skipif(not NAMESPACES, reason="needs root, unshare and nsenter (a PID namespace plays the container)")
def test_the_prestop_hook_drains_the_gateway_as_process_1(tmp_path: Path) -> None:
    """The gateway's container, played by a PID namespace in which ``polar serve`` is process 1 (``unshare --pid``), run
    with the manifest's command, arguments and environment (only the server's URL, the ports, the data dir and the
    backend swapped for this test's; the token from the "Secret" in $POLAR_SERVER_TOKEN); the manifest's preStop
    command, run in that namespace (``nsenter``), drains it: the hook holds on while the session under way finishes
    there (process 1 takes the SIGTERM: polar handles it), and ends with the gateway."""
    config = serve_config(tmp_path, "serve")
    server = Serve(tmp_path / "server", "--role", "server", "--port", "0", "--config", str(config))
    workload = resource("Deployment", "polar-gateway")
    spec = container(workload)
    hook = spec["lifecycle"]["preStop"]["exec"]["command"]
    data = tmp_path / "gateway"
    data.mkdir()
    marker = tmp_path / "go"
    proc: subprocess.Popen[bytes] | None = None
    stopping: subprocess.Popen[bytes] | None = None

    async def body() -> None:
        nonlocal proc, stopping
        info = await server.ready()
        env = {"POD_IP": "127.0.0.1", "POLAR_SERVER_TOKEN": info["token"]}  # the downward API's and the Secret's
        assert {e["name"] for e in spec["env"]} == set(env)
        swap = {"--server": info["url"], "--port": str(free_port()), "--data-dir": str(data)}
        line = [_expand(a, env) for a in spec["command"][2:] + spec["args"]]
        argv = []
        for flag, value in zip(line[::2], line[1::2], strict=True):  # options and values: the manifest's pairs
            if flag not in ("--backend", "--backend-url"):  # the scripted backend (the default): no vLLM here
                argv += [flag, swap.get(flag, value)]
        run_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
        run_env.pop("POLAR_TOKEN", None)
        with (data / "stderr").open("wb") as err:
            proc = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "polar_cli", "serve",
                 *argv, "--config", str(config)],
                stdout=subprocess.DEVNULL, stderr=err, env=run_env, cwd=data,
            )  # fmt: skip

        async def registered() -> bool:
            async with client(info) as http:
                return len((await http.get("/rollout/status")).json()["nodes"]) == 1

        await until_true(registered, "the gateway registered")
        announced = json.loads((data / "serve.json").read_text())
        assert announced["pid"] == 1  # polar serve is process 1 of its namespace, as in the container
        node_token, gateway_url = announced["node_token"], announced["gateway_url"]
        async with client(info) as http:
            await http.post("/rollout/task/submit", json=waiting_task("pre-stop", 1, marker))
        await until_true(lambda: running(gateway_url, node_token, 1), "the session running on the gateway")

        pid1 = _child(proc.pid)
        stopping = subprocess.Popen(["nsenter", "--target", str(pid1), "--pid", *hook])
        said = data / "stderr"
        await until_true(lambda: asyncio.sleep(0, "Draining:" in said.read_text()), "the gateway to drain")
        assert stopping.poll() is None and proc.poll() is None  # the hook waits for the drain, which waits for us
        marker.touch()
        results = one_result_per_sample(await finished(info, "pre-stop"), 1)
        assert results[0].metadata["polar_attempt"] == 1  # finished there, in the drain: not handed back
        await until_true(lambda: asyncio.sleep(0, proc is not None and proc.poll() is not None), "the gateway to exit")
        await until_true(lambda: asyncio.sleep(0, stopping is not None and stopping.poll() is not None),
                         "the hook to end with the gateway")  # fmt: skip
        assert "Drained: 1 sessions finished here; 0 handed back" in said.read_text(), said.read_text()
        assert proc.returncode == 0, said.read_text()

    try:
        asyncio.run(body())
    finally:
        marker.touch()
        for started in (stopping, proc):
            if started is not None and started.poll() is None:
                started.kill()
                started.wait()
        server.stop()
