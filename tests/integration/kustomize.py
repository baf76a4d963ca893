"""Reading the install manifests (deploy/kubernetes/) as the cluster would get them: rendered
by `kubectl kustomize`, and a container's command line as the kubelet expands it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"

Object = dict[str, Any]


def kustomize(directory: Path) -> list[Object]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is missing: `make test` installs it (apt-get)"
    rendered = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def of_kind(docs: list[Object], *kinds: str) -> list[Object]:
    return [d for d in docs if d["kind"] in kinds]


def named(docs: list[Object], kind: str, name: str) -> Object:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_spec(workload: Object) -> Object:
    spec: Object = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Object) -> Object:
    only: Object
    [only] = pod_spec(workload)["containers"]
    return only


def expanded_args(docs: list[Object], workload: Object) -> list[str]:
    """The container's args with `$(VAR)` expanded from its env as the kubelet does: a field
    of the pod (its namespace) or a ConfigMap key; anything else stays as written."""
    env: dict[str, str] = {}
    for var in container(workload).get("env", []):
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = var["value"]
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[var["name"]] = workload["metadata"]["namespace"]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = named(docs, "ConfigMap", ref["name"])["data"][ref["key"]]
    args: list[str] = container(workload)["args"]
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def env_sources(workload: Object) -> dict[str, Object]:
    """Each env variable of the workload's containers, by name: its `value` or `valueFrom`."""
    containers = [*pod_spec(workload).get("initContainers", []), *pod_spec(workload)["containers"]]
    return {v["name"]: v for c in containers for v in c.get("env", [])}
