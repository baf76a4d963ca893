"""The control plane's manifests (deploy/kubernetes/control-plane): the hub, projector and
API run command lines and settings Wingsmith accepts, nothing runs as root or reaches more
than it talks to, the NATS servers form a cluster with the configuration `wingsmith nats-config`
writes, and the secrets generator writes every Secret key the manifests and that configuration
refer to. (Rendering and validating every kustomization: test_manifests.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest

from tests.integration.kustomize import (
    DEPLOY,
    Object,
    container,
    env_sources,
    expanded_args,
    kustomize,
    named,
    of_kind,
    pod_spec,
)
from wingsmith.services.cli.main import build_parser, main
from wingsmith.services.config import Settings
from wingsmith.services.environment import Environment

RBAC = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


@pytest.fixture(scope="module")
def docs() -> list[Object]:
    return kustomize(DEPLOY / "control-plane")


CONTROL_PLANE = {
    "wingsmith-hub": ["-v", "up", "--no-api"],
    "wingsmith-projector": ["-v", "projector"],
    "wingsmith-api": ["-v", "api"],
}


@pytest.mark.parametrize("name", CONTROL_PLANE)
def test_the_control_plane_runs_command_lines_wingsmith_accepts(
    docs: list[Object], name: str
) -> None:
    args = expanded_args(docs, named(docs, "Deployment", name))
    assert args == CONTROL_PLANE[name]
    command = next(word for word in args if not word.startswith("-"))
    parsed = build_parser(command).parse_args(args)  # a misspelt flag fails here
    assert parsed.verbose


# what the Secrets hold, in the form Wingsmith reads (control-plane/secrets/generate.sh)
SECRETS = {
    "WINGSMITH_STORE": "postgresql://wingsmith:pw@postgres:5432/wingsmith",
    "WINGSMITH_API_TOKENS": f"admin:{'x' * 24}",
    "WINGSMITH_API_READ_TOKENS": "",
}


def test_the_control_plane_sets_only_variables_wingsmith_reads(docs: list[Object]) -> None:
    known = {str(f.validation_alias) for f in Environment.model_fields.values()}
    for name in CONTROL_PLANE:
        env = env_sources(named(docs, "Deployment", name))
        assert set(env) <= known, name
        values = {k: v.get("value", SECRETS.get(k, "x" * 24)) for k, v in env.items()}
        settings = Settings.from_env(values)  # every value as Wingsmith reads it
        assert settings.nats_url == "nats://nats:4222"
        assert settings.stream_replicas == 3 or name == "wingsmith-api"
    hub = env_sources(named(docs, "Deployment", "wingsmith-hub"))
    assert hub["WINGSMITH_PROJECTOR"]["value"] == "false"  # the projector is a Deployment


def test_the_control_plane_runs_as_no_root_and_reaches_only_what_it_talks_to(
    docs: list[Object],
) -> None:
    workloads = of_kind(docs, "Deployment", "StatefulSet")
    assert len(workloads) == 5
    policies = of_kind(docs, "NetworkPolicy")
    for workload in workloads:
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        assert container(workload)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container(workload)["securityContext"]["allowPrivilegeEscalation"] is False
        labels = workload["spec"]["template"]["metadata"]["labels"]
        governing = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        assert governing, workload["metadata"]["name"]
        assert all(set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} for p in governing)
    assert not of_kind(docs, *RBAC)


def selects(selector: Object, labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {}).items() <= labels.items()
    return wanted and all(
        labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
    )


def test_the_nats_servers_route_to_each_other_and_keep_streams_on_volumes(
    docs: list[Object],
) -> None:
    nats = named(docs, "StatefulSet", "nats")
    headless = named(docs, "Service", nats["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    replicas = nats["spec"]["replicas"]
    assert replicas == 3
    args = dict(a.removeprefix("--").partition("=")[::2] for a in container(nats)["args"])
    routes = {f"nats://nats-{i}.{headless['metadata']['name']}:6222" for i in range(replicas)}
    assert set(args["routes"].split(",")) == routes
    [claim] = nats["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": args["store_dir"]} in container(nats)[
        "volumeMounts"
    ]
    [config] = [v for v in pod_spec(nats)["volumes"] if "configMap" in v]
    generated = named(docs, "ConfigMap", config["configMap"]["name"])
    assert args["config"] == "/etc/nats/auth.conf" and "auth.conf" in generated["data"]
    assert container(nats)["envFrom"] == [{"secretRef": {"name": "wingsmith-nats"}}]
    # where the operator base looks for NATS: this Service, in this namespace
    client = named(docs, "Service", "nats")
    operator_config = (DEPLOY / "operator/base/config.env").read_text()
    address = f"nats://nats.{client['metadata']['namespace']}:{client['spec']['ports'][0]['port']}"
    assert f"WINGSMITH_NATS_URL={address}" in operator_config.splitlines()


def test_the_control_plane_config_is_what_nats_config_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["nats-config", "--cluster", "east"]) == 0
    assert (DEPLOY / "control-plane/auth.conf").read_text() == capsys.readouterr().out


def test_postgres_keeps_its_data_on_a_volume_below_its_root(docs: list[Object]) -> None:
    postgres = named(docs, "StatefulSet", "postgres")
    env = env_sources(postgres)
    assert env["POSTGRES_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "wingsmith-postgres", "key": "password"}
    }
    [claim] = postgres["spec"]["volumeClaimTemplates"]
    [mount] = [m for m in container(postgres)["volumeMounts"] if m["name"] == "data"]
    assert Path(env["PGDATA"]["value"]).parent == Path(mount["mountPath"])
    assert claim["metadata"]["name"] == "data"
    service = named(docs, "Service", "postgres")
    assert service["spec"]["ports"][0]["port"] == 5432


def generated(tmp_path: Path, *cluster_ids: str) -> Path:
    """control-plane/secrets, copied into `tmp_path` (once), with the secrets of
    `cluster_ids` generated."""
    secrets = tmp_path / "secrets"
    if not secrets.exists():
        shutil.copytree(DEPLOY / "control-plane" / "secrets", secrets)
    done = generate(secrets, *cluster_ids)
    assert done.returncode == 0, done.stderr
    return secrets


def generate(secrets: Path, *cluster_ids: str) -> subprocess.CompletedProcess[str]:
    script = str(secrets / "generate.sh")
    return subprocess.run([script, *cluster_ids], capture_output=True, text=True, timeout=30)


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_the_generator_writes_every_secret_the_control_plane_refers_to(
    tmp_path: Path, docs: list[Object]
) -> None:
    secrets = kustomize(generated(tmp_path, "east"))
    for doc in secrets:
        kubernetes_validate.validate(doc, "1.32", strict=True)
    keys = {(s["metadata"]["name"], key) for s in secrets for key in s["data"]}
    referred = set()
    for workload in of_kind(docs, "Deployment", "StatefulSet"):
        for var in env_sources(workload).values():
            if ref := var.get("valueFrom", {}).get("secretKeyRef"):
                referred.add((ref["name"], ref["key"]))
    assert referred and referred <= keys
    # the passwords the NATS configuration refers to, which the servers read from wingsmith-nats
    config = (DEPLOY / "control-plane" / "auth.conf").read_text()
    references = set(re.findall(r"password: \$(\w+)", config))
    assert references == {key for name, key in keys if name == "wingsmith-nats"}
    assert {s["metadata"]["namespace"] for s in secrets} == {"wingsmith-system"}


def test_the_generator_keeps_what_it_wrote_and_adds_clusters(tmp_path: Path) -> None:
    secrets = generated(tmp_path, "east")
    first = env_file(secrets / "nats.env")
    postgres = env_file(secrets / "postgres.env")
    generated(tmp_path, "east", "gpu-prod-1")  # again, into the same directory
    nats = env_file(secrets / "nats.env")
    assert first.items() <= nats.items()
    assert env_file(secrets / "postgres.env") == postgres
    assert (
        postgres["url"] == f"postgresql://wingsmith:{postgres['password']}@postgres:5432/wingsmith"
    )
    login = env_file(secrets / "operator-gpu-prod-1.env")
    assert login == {
        "user": "operator-gpu-prod-1",
        "password": nats["NATS_PASSWORD_OPERATOR_GPU_PROD_1"],
    }
    assert len(set(nats.values())) == len(nats)  # every user its own password
    assert all(len(value) == 48 for value in nats.values())
    tokens = env_file(secrets / "api.env")["tokens"]
    assert tokens.startswith("admin:") and len(tokens) > 16


def test_the_generator_refuses_what_is_no_cluster_id(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    shutil.copytree(DEPLOY / "control-plane" / "secrets", secrets)
    done = generate(secrets, "east", "Bad_Id")
    assert done.returncode == 2 and "a cluster id is a DNS label" in done.stderr
    assert not list(secrets.glob("*.env"))
