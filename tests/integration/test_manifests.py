"""The install manifests (deploy/kubernetes/): every base and overlay renders with
`kubectl kustomize` and validates offline against the Kubernetes schemas; Secrets are referenced,
never written in; the read-only overlays grant nothing but reads; the operator runs a command
line its own parser accepts; the node agent has no RBAC and reads the kubelet's socket directory
read-only, beside its operator. (The control plane's: test_control_plane_manifests.py.)"""

from __future__ import annotations

import argparse

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
from wingsmith.services.cli.main import build_parser
from wingsmith.services.config import Settings

KUBERNETES = "1.32"  # the schemas validated against
READS = {"get", "list", "watch"}
RBAC = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
# every kustomization that builds alone; the component (cluster/node-agents) builds in the
# cluster overlays, and control-plane/secrets from the files its generator writes
# (test_control_plane_manifests.py renders it)
BUILT = [
    "cluster/base",
    "cluster/read-only",
    "control-plane",
    "node-agent",
    "operator/adopt",
    "operator/base",
    "operator/read-only",
]
WITH_OPERATOR = ["operator/adopt", "operator/base", "operator/read-only"]
WITH_OPERATOR += ["cluster/base", "cluster/read-only"]
SOCKET_DIR = "/var/lib/kubelet/pod-resources"


def test_every_kustomization_is_built_or_said_why_not() -> None:
    found = {str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml")}
    assert found == {*BUILT, "cluster/node-agents", "control-plane/secrets"}


@pytest.mark.parametrize("directory", BUILT)
def test_every_kustomization_renders_and_validates_against_the_kubernetes_schemas(
    directory: str,
) -> None:
    docs = kustomize(DEPLOY / directory)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    cluster_wide = {"ClusterRole", "ClusterRoleBinding"}
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] not in cluster_wide}
    expected = "wingsmith-system" if directory == "control-plane" else "wingsmith"
    assert namespaces == {expected}


@pytest.mark.parametrize("directory", BUILT)
def test_secrets_are_referenced_and_never_written_in(directory: str) -> None:
    docs = kustomize(DEPLOY / directory)
    assert not of_kind(docs, "Secret")
    for workload in of_kind(docs, "Deployment", "StatefulSet", "DaemonSet"):
        for name, var in env_sources(workload).items():
            if any(word in name for word in ("PASSWORD", "TOKEN", "STORE")):
                assert "secretKeyRef" in var.get("valueFrom", {}), (directory, name)


def operator_args(docs: list[Object]) -> argparse.Namespace:
    """The operator's command line in its Deployment, parsed by the operator's own parser."""
    deployment = named(docs, "Deployment", "wingsmith-operator")
    parsed: argparse.Namespace = build_parser("operator").parse_args(
        expanded_args(docs, deployment)
    )
    return parsed


@pytest.mark.parametrize("directory", WITH_OPERATOR)
def test_the_operator_runs_a_command_line_it_accepts(directory: str) -> None:
    args = operator_args(kustomize(DEPLOY / directory))
    assert args.in_cluster and args.probes == ("0.0.0.0", 8081)
    assert (args.cluster_id, args.namespace) == ("east", "wingsmith")


@pytest.mark.parametrize("directory", ["operator/read-only", "cluster/read-only"])
def test_the_read_only_overlays_grant_no_verb_but_reads_and_run_read_only(directory: str) -> None:
    docs = kustomize(DEPLOY / directory)
    assert verbs(docs) == READS
    args = operator_args(docs)
    assert args.read_only and not args.leader_elect
    assert named(docs, "Deployment", "wingsmith-operator")["spec"]["replicas"] == 1


def verbs(docs: list[Object]) -> set[str]:
    roles = of_kind(docs, "Role", "ClusterRole")
    return {verb for role in roles for rule in role["rules"] for verb in rule["verbs"]}


def test_the_base_writes_only_in_its_namespace_and_adopt_adds_where_graphs_live() -> None:
    base = kustomize(DEPLOY / "operator/base")
    cluster_roles = of_kind(base, "ClusterRole")
    assert verbs(cluster_roles) == READS  # cluster-wide, it only reads
    [role] = of_kind(base, "Role")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # what it does: apply (patch) and delete DGDs, scale adapters, record Events, hold a Lease
    assert {
        ("dynamographdeployments", "patch"),
        ("dynamographdeployments", "delete"),
        ("dynamographdeploymentscalingadapters/scale", "patch"),
        ("events", "create"),
        ("leases", "update"),
    } <= granted
    assert operator_args(base).leader_elect
    adopt = kustomize(DEPLOY / "operator/adopt")
    [adopting] = [
        r for r in of_kind(adopt, "ClusterRole") if r["metadata"]["name"].endswith("adopt")
    ]
    assert verbs([adopting]) == {"patch", "create"}


def test_the_node_agent_has_no_rbac_and_no_token() -> None:
    docs = kustomize(DEPLOY / "node-agent")
    assert not of_kind(docs, *RBAC)
    account = named(docs, "ServiceAccount", "wingsmith-node-agent")
    agent = named(docs, "DaemonSet", "wingsmith-node-agent")
    assert pod_spec(agent)["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    assert pod_spec(agent)["automountServiceAccountToken"] is False
    for directory in ["cluster/base", "cluster/read-only"]:  # nor does the operator's lend it any
        bindings = of_kind(kustomize(DEPLOY / directory), "RoleBinding", "ClusterRoleBinding")
        subjects = {s["name"] for b in bindings for s in b["subjects"]}
        assert subjects == {"wingsmith-operator"}


def test_the_node_agent_reads_the_socket_directory_read_only_as_root_without_capabilities() -> None:
    agent = named(kustomize(DEPLOY / "node-agent"), "DaemonSet", "wingsmith-node-agent")
    spec = pod_spec(agent)
    [host] = [v for v in spec["volumes"] if "hostPath" in v]
    assert host["hostPath"] == {"path": SOCKET_DIR, "type": "Directory"}
    [mount] = [m for m in container(agent)["volumeMounts"] if m["name"] == host["name"]]
    assert (mount["mountPath"], mount["readOnly"]) == (SOCKET_DIR, True)
    assert spec["securityContext"]["runAsUser"] == 0  # the kubelet's socket is root's alone
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(agent)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # on GPU nodes only, and on those however they are tainted for GPU work
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert container(agent)["resources"]["limits"]["memory"]


def test_the_node_agent_reaches_only_dns_and_nats() -> None:
    policy = named(kustomize(DEPLOY / "node-agent"), "NetworkPolicy", "wingsmith-node-agent")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "wingsmith-node-agent"
    }
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in policy["spec"]  # nothing reaches it
    ports = {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert ports == {(53, "UDP"), (53, "TCP"), (4222, "TCP")}


@pytest.mark.parametrize("directory", ["cluster/base", "cluster/read-only"])
def test_the_node_agent_runs_beside_its_operator_with_its_login(directory: str) -> None:
    """The agent logs in as its cluster's operator, from the operator's ConfigMap (the one
    kustomize generated, hash and all) and Secret; the operator waits for its device ids."""
    docs = kustomize(DEPLOY / directory)
    agent = named(docs, "DaemonSet", "wingsmith-node-agent")
    operator = named(docs, "Deployment", "wingsmith-operator")
    login = ["WINGSMITH_NATS_URL", "WINGSMITH_NATS_USER", "WINGSMITH_NATS_PASSWORD"]
    for name in login:
        assert env_sources(agent)[name] == env_sources(operator)[name]
    assert env_sources(operator)["WINGSMITH_OPERATOR_NODE_AGENTS"]["value"] == "true"
    assert env_sources(agent)["WINGSMITH_NODE_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }
    # both command lines as their own parsers read them, with the environment they are given
    args = build_parser("node-agent").parse_args(expanded_args(docs, agent))
    assert (args.cluster_id, args.socket) == ("east", f"{SOCKET_DIR}/kubelet.sock")
    assert args.node is None  # from WINGSMITH_NODE_NAME, above
    settings = Settings.from_env({"WINGSMITH_OPERATOR_NODE_AGENTS": "true"})
    assert settings.operator_node_agents
