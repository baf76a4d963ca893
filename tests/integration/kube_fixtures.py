"""Shared Kubernetes test fixtures: a kmock API emulator served over real HTTP, a `Kube` pointed
at it, object builders, and helpers that change the emulated cluster and read its request log.

kmock stores objects and streams watch events, but it assigns no resourceVersions, ignores
selectors and never answers 410; tests that need those script kmock's responses themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import kmock
import yaml

from wingsmith.adapters.kube import RESOURCES, Change, Informer, Kind, Kube

Obj = dict[str, Any]
NAMESPACE = "wingsmith"

# kmock's resource keys for the kinds the adapter knows, e.g. "nvidia.com/v1beta1/..."
RESOURCE_KEYS: dict[Kind, str] = {
    kind: f"{r.group}/{r.version}/{r.plural}" if r.group else f"{r.version}/{r.plural}"
    for kind, r in RESOURCES.items()
}
KIND_NAMES: dict[Kind, str] = {
    "dgd/v1beta1": "DynamoGraphDeployment",
    "dgd/v1alpha1": "DynamoGraphDeployment",
    "pod": "Pod",
    "node": "Node",
}


def resource(kind: Kind) -> kmock.resource:
    """kmock's filter for one kind, e.g. `emulator[kmock.action.WATCH, resource("pod")]`."""
    r = RESOURCES[kind]
    return kmock.resource(r.group, r.version, r.plural)


@contextlib.asynccontextmanager
async def kube_emulator(
    kinds: Iterable[Kind] = tuple(RESOURCES), **kube_options: Any
) -> AsyncIterator[tuple[kmock.KubernetesEmulator, kmock.Server, Kube]]:
    """A kmock emulator serving `kinds` over HTTP and a connected `Kube`, with a short backoff
    so that retries do not slow tests down (override with `backoff=(first, cap)`)."""
    kube_options.setdefault("backoff", (0.01, 0.05))
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        for kind in kinds:
            r = RESOURCES[kind]
            info = kmock.ResourceInfo(kind=KIND_NAMES[kind], namespaced=r.namespaced)
            emulator.resources[RESOURCE_KEYS[kind]] = info
        async with Kube(host=str(server.url), **kube_options) as kube:
            yield emulator, server, kube


# --- object builders -----------------------------------------------------------------------------


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig whose current context reaches `server_url` with a bearer token."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "emu", "cluster": {"server": server_url.rstrip("/")}}],
                "users": [{"name": "me", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "test", "context": {"cluster": "emu", "user": "me"}}],
            }
        )
    )
    return path


def dgd(
    name: str,
    namespace: str = NAMESPACE,
    *,
    labels: dict[str, str] | None = None,
    spec: Obj | None = None,
    version: str = "v1beta1",
) -> Obj:
    default_spec: Obj = (
        {"components": [{"name": "worker", "type": "worker", "replicas": 1}]}
        if version == "v1beta1"
        else {"services": {"worker": {"componentType": "worker", "replicas": 1}}}
    )
    return {
        "apiVersion": f"nvidia.com/{version}",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec if spec is not None else default_spec,
    }


def pod(
    name: str,
    namespace: str = NAMESPACE,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    phase: str = "Running",
    ready: bool = True,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node(
    name: str, *, product: str = "NVIDIA-H100-80GB-HBM3", gpus: int = 8, ready: bool = True
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


# --- changing the emulated cluster over HTTP (so that open watches see it) -------------------


def collection_path(kind: Kind, namespace: str | None) -> str:
    r = RESOURCES[kind]
    base = f"/apis/{r.group}/{r.version}" if r.group else f"/api/{r.version}"
    scope = f"/namespaces/{namespace}" if r.namespaced and namespace else ""
    return f"{base}{scope}/{r.plural}"


def object_path(kind: Kind, obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{collection_path(kind, meta.get('namespace'))}/{meta['name']}"


async def cluster_create(emulator: kmock.KubernetesEmulator, kind: Kind, obj: Obj) -> None:
    """Create an object the way another client would (not through the adapter under test)."""
    path = collection_path(kind, obj["metadata"].get("namespace"))
    async with emulator.post(path, json=obj) as resp:
        assert resp.status < 300, await resp.text()


async def cluster_patch(
    emulator: kmock.KubernetesEmulator, kind: Kind, obj: Obj, patch: Obj
) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with emulator.patch(object_path(kind, obj), json=patch, headers=headers) as resp:
        assert resp.status < 300, await resp.text()


async def cluster_delete(emulator: kmock.KubernetesEmulator, kind: Kind, obj: Obj) -> None:
    async with emulator.delete(object_path(kind, obj)) as resp:
        assert resp.status < 300, await resp.text()


# --- reading the request log -----------------------------------------------------------------


def from_adapter(request: kmock.Request) -> bool:
    """True for requests the code under test sent; the cluster_* helpers above go through
    kmock's own client, whose User-Agent says so."""
    return not request.headers.get("User-Agent", "").startswith("kmock/")


def requests(
    emulator: kmock.KubernetesEmulator, action: kmock.action, kind: Kind | None = None
) -> list[kmock.Request]:
    """The adapter's requests of one action (and kind), oldest first."""
    view = emulator[action] if kind is None else emulator[action, resource(kind)]
    return [r for r in view if from_adapter(r)]


def write_requests(emulator: kmock.KubernetesEmulator) -> list[kmock.Request]:
    """Every request the code under test sent that would change the cluster, whatever its
    kind: read-only code must leave this empty."""
    writes = {"POST", "PUT", "PATCH", "DELETE"}
    return [r for r in emulator if r.method.value in writes and from_adapter(r)]


# --- consuming informers -----------------------------------------------------------------------


async def next_change(informer: Informer, timeout: float = 5.0) -> Change:
    """The next change; the timeout only guards against a hung test."""
    return await asyncio.wait_for(anext(informer), timeout)


async def until_synced(informer: Informer, timeout: float = 5.0) -> list[Change]:
    """Changes up to and excluding the next SYNCED marker, after the RELISTING one."""
    assert (await next_change(informer, timeout)).type == "RELISTING"
    changes: list[Change] = []
    while (change := await next_change(informer, timeout)).type != "SYNCED":
        changes.append(change)
    return changes


def names(changes: Iterable[Change]) -> list[tuple[str, str]]:
    """(type, name) pairs: short to compare in assertions."""
    return [(c.type, c.obj.get("metadata", {}).get("name", "")) for c in changes]


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition on the emulator's state; the timeout only guards against a hung test."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)
