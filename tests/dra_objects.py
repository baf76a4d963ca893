"""Dynamic Resource Allocation objects as an API server returns them, in each served version of
resource.k8s.io (v1, v1beta2, v1beta1), for the unit and the kmock tests alike.

What differs between versions, in the fields these objects carry: v1beta1 keeps a device's
attributes and capacity under `basic` and a request's class and count on the request itself;
v1beta2 and v1 put them on the device, and under `exactly`. Claims' statuses and pods are the
same in all three. Device attributes follow NVIDIA's DRA driver (gpu.nvidia.com): `type`,
`uuid`, `productName`, versions for the driver and compute capability.
"""

from __future__ import annotations

import uuid as uuids
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
VERSIONS = ("v1", "v1beta2", "v1beta1")
NVIDIA = "gpu.nvidia.com"
NAMESPACE = "wingsmith"


@dataclass(frozen=True)
class Gpu:
    """A device a slice publishes; `uuid` None publishes none (then its id is the fallback)."""

    name: str
    uuid: str | None = None
    type: str = "gpu"
    node: str | None = None  # per-device node (a slice with perDeviceNodeSelection)


def uid_of(name: str) -> str:
    """A stable uid per name, as the API server would have given it."""
    return str(uuids.uuid5(uuids.NAMESPACE_DNS, name))


def resource_slice(
    name: str,
    devices: Iterable[Gpu],
    *,
    version: str = "v1",
    node: str | None = None,
    pool: str | None = None,
    generation: int = 1,
    slices_in_pool: int = 1,
    driver: str = NVIDIA,
) -> Obj:
    """One slice of a pool (named after the node unless given), as NVIDIA's driver writes it."""
    spec: Obj = {
        "driver": driver,
        "pool": {
            "name": pool or node or name,
            "generation": generation,
            "resourceSliceCount": slices_in_pool,
        },
        "devices": [_device(d, version) for d in devices],
    }
    if node is not None:
        spec["nodeName"] = node
    elif any(d.node for d in devices):
        spec["perDeviceNodeSelection"] = True
    else:
        spec["allNodes"] = True
    owner = (
        [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid_of(node)}] if node else []
    )
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {
            "name": name,
            "generateName": f"{node or 'pool'}-{driver}-",
            "uid": uid_of(f"slice/{name}"),
            "ownerReferences": owner,
        },
        "spec": spec,
    }


def _device(gpu: Gpu, version: str) -> Obj:
    attributes: Obj = {
        "type": {"string": gpu.type},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.133.20"},
    }
    if gpu.uuid is not None:
        attributes["uuid"] = {"string": gpu.uuid}
    fields: Obj = {"attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}
    if gpu.node is not None:
        fields["nodeName"] = gpu.node
    return (
        {"name": gpu.name, "basic": fields} if version == "v1beta1" else {"name": gpu.name} | fields
    )


def resource_claim(
    name: str,
    namespace: str = NAMESPACE,
    *,
    version: str = "v1",
    allocated: Sequence[tuple[str, str]] | None = None,
    reserved_for: Iterable[Obj] = (),
    driver: str = NVIDIA,
    owner: Obj | None = None,
    admin_access: bool = False,
) -> Obj:
    """A claim for GPUs. `allocated`: (pool, device) pairs of `driver` (None: not allocated
    yet); `reserved_for`: the pods it is reserved for; `owner`: the pod it was made for from a
    template."""
    request: Obj = {"deviceClassName": driver, "allocationMode": "ExactCount", "count": 1}
    if allocated:
        request["count"] = len(allocated)
    requests = [
        {"name": "gpus", **request}
        if version == "v1beta1"
        else {"name": "gpus", "exactly": request}
    ]
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid_of(f"claim/{namespace}/{name}")}
    if owner is not None:
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpus"}
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    claim: Obj = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": requests}},
        "status": {},
    }
    if allocated is not None:
        results: list[Obj] = [
            {"request": "gpus", "driver": driver, "pool": pool, "device": device}
            for pool, device in allocated
        ]
        if admin_access:
            for result in results:
                result["adminAccess"] = True
        claim["status"]["allocation"] = {"devices": {"results": results}}
    reserved = [
        {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
        for p in reserved_for
    ]
    if reserved:
        claim["status"]["reservedFor"] = reserved
    return claim


def claim_pod(
    name: str,
    namespace: str = NAMESPACE,
    *,
    node: str | None = "n1",
    generated: str | None = None,
    shared: str | None = None,
    uid: str | None = None,
) -> Obj:
    """A worker pod asking for GPUs by claim: `generated` names the claim made for it from a
    template (in its status, as the claim controller records it); `shared` names a claim
    others may use too (only in its spec)."""
    claims: list[Obj] = []
    statuses: list[Obj] = []
    if generated is not None:
        claims.append({"name": "gpus", "resourceClaimTemplateName": "worker-gpus"})
        statuses.append({"name": "gpus", "resourceClaimName": generated})
    if shared is not None:
        claims.append({"name": "shared", "resourceClaimName": shared})
    spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.9.1",
                "resources": {"claims": [{"name": c["name"]} for c in claims]},
            }
        ],
        "resourceClaims": claims,
    }
    if node is not None:
        spec["nodeName"] = node
    status: Obj = {"phase": "Running" if node else "Pending"}
    if statuses:
        status["resourceClaimStatuses"] = statuses
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or uid_of(f"pod/{namespace}/{name}"),
        },
        "spec": spec,
        "status": status,
    }


def as_listed(obj: Obj) -> Obj:
    """The object as a list's item: an API server leaves out apiVersion and kind there."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
