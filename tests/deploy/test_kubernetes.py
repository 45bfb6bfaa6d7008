"""deploy/kubernetes on paper (no cluster here): every manifest passes ``kubernetes-validate`` (strict: a misspelled
field fails) for current Kubernetes releases, the docs show the files as they are, and what the manifests promise
holds against the real CLI: each container's ``polar serve`` arguments parse, the token reaches the pods from the
Secret and never on a command line, the probes ask ``/healthz`` on the port the process binds, the volume is the
data dir, and a gateway's grace period covers its drain."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from polar_cli.cli import build_app
from polar_cli.gateway.agent import HAND_BACK_S
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
