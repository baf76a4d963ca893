"""The install manifests (deploy/kubernetes/): every overlay renders with `kubectl kustomize`
and validates offline against the Kubernetes schemas; the read-only overlay grants nothing
but reads; the operator's Deployment runs a command line the operator accepts."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from wingsmith.services.cli.main import build_parser

OPERATOR = Path(__file__).parent.parent.parent / "deploy" / "kubernetes" / "operator"
OVERLAYS = sorted(p.name for p in OPERATOR.iterdir() if (p / "kustomization.yaml").exists())
KUBERNETES = "1.32"  # the schemas validated against
READS = {"get", "list", "watch"}


def kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is missing: `make test` installs it (apt-get)"
    rendered = subprocess.run(
        [kubectl, "kustomize", str(OPERATOR / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def of_kind(docs: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in kinds]


def verbs(docs: list[dict[str, Any]]) -> set[str]:
    roles = of_kind(docs, "Role", "ClusterRole")
    return {verb for role in roles for rule in role["rules"] for verb in rule["verbs"]}


def operator_args(docs: list[dict[str, Any]]) -> argparse.Namespace:
    """The operator's command line in the Deployment, as the kubelet expands `$(VAR)` from
    the container's env, parsed by the operator's own parser."""
    [deployment] = of_kind(docs, "Deployment")
    [config] = of_kind(docs, "ConfigMap")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for var in container["env"]:
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            env[var["name"]] = deployment["metadata"]["namespace"]
        elif "configMapKeyRef" in source:
            assert source["configMapKeyRef"]["name"] == config["metadata"]["name"]
            env[var["name"]] = config["data"][source["configMapKeyRef"]["key"]]
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], arg) for arg in container["args"]]
    parsed: argparse.Namespace = build_parser("operator").parse_args(args)
    return parsed


def test_there_are_the_three_overlays() -> None:
    assert OVERLAYS == ["adopt", "base", "read-only"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    docs = kustomize(overlay)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    cluster_wide = {"ClusterRole", "ClusterRoleBinding"}
    namespaced = [d for d in docs if d["kind"] not in cluster_wide]
    assert {d["metadata"].get("namespace") for d in namespaced} == {"wingsmith"}
    # what the Deployment runs, the operator's own command line takes
    args = operator_args(docs)
    assert args.in_cluster and args.probes == ("0.0.0.0", 8081)
    assert (args.cluster_id, args.namespace) == ("east", "wingsmith")


def test_the_read_only_overlay_grants_no_verb_but_reads_and_runs_read_only() -> None:
    docs = kustomize("read-only")
    assert verbs(docs) == READS
    args = operator_args(docs)
    assert args.read_only and not args.leader_elect
    [deployment] = of_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1


def test_the_base_writes_only_in_its_namespace_and_adopt_adds_where_graphs_live() -> None:
    base = kustomize("base")
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
    adopt = kustomize("adopt")
    [adopting] = [
        r for r in of_kind(adopt, "ClusterRole") if r["metadata"]["name"].endswith("adopt")
    ]
    assert verbs([adopting]) == {"patch", "create"}
