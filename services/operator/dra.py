"""Which devices each pod holds, and which each node has, on a cluster that allocates GPUs with
Dynamic Resource Allocation (DRA). Pure.

On such a cluster a pod asks for GPUs through ResourceClaims rather than `nvidia.com/gpu` limits.
The scheduler allocates devices to a claim (`status.allocation.devices.results[]`: driver, pool,
device) and reserves the claim for the pods that use it (`status.reservedFor[]`); a claim made
from a template is named in its pod's `status.resourceClaimStatuses[]`. Each driver describes
its devices in ResourceSlices, by pool, with attributes such as NVIDIA's GPU `uuid`. This module
joins the three, read as plain JSON of any served version (resource.k8s.io v1, v1beta2 or
v1beta1: they differ, for what is read here, only in v1beta1 keeping a device's fields under
`basic`), so that replicas carry real device ids and nodes the devices they have.

Objects come from the cluster, not from Wingsmith: one that does not read as its kind (a field
missing or of the wrong type) is passed over, never raised on, and named in `skipped` for the
caller to log. A malformed part of an object (one allocation result, one device) costs only
that part.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu)
UUID_ATTRIBUTE = "uuid"  # the GPU's (or MIG device's) UUID, as nvidia-smi shows it
TYPE_ATTRIBUTE = "type"  # NVIDIA: "gpu", "mig" or "vfio"

PodKey = tuple[str, str]  # (namespace, name)
DeviceKey = tuple[str, str, str]  # (driver, pool, device): what an allocation names
Obj = Mapping[str, Any]
T = TypeVar("T")


class Oddity(StrEnum):
    """Why something read from the cluster was passed over, or read with a fallback."""

    MALFORMED = "malformed"  # a field missing or of the wrong type
    DUPLICATE_DEVICE = "duplicate_device"  # a device twice in its pool's newest generation
    INCOMPLETE_POOL = "incomplete_pool"  # fewer slices than the pool's resourceSliceCount
    UNPUBLISHED_DEVICE = "unpublished_device"  # allocated, absent from its pool's newest slices


@dataclass(frozen=True)
class Skipped:
    """One thing the caller may want to log: which object, what was odd, and where."""

    kind: str  # "Pod", "ResourceClaim" or "ResourceSlice"
    namespace: str
    name: str
    oddity: Oddity
    detail: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: {self.oddity}: {self.detail}"


@dataclass(frozen=True)
class Device:
    """A device a slice publishes (or an allocation names). `id` is its `uuid` attribute, or
    `<driver>/<pool>/<device>` when it has none; `node` is None for a device not tied to one
    node (a pool for all nodes or a node selector)."""

    id: str
    driver: str
    pool: str
    name: str
    node: str | None
    type: str | None  # the driver's `type` attribute, when it sets one


@dataclass(frozen=True)
class DraDevices:
    """What DRA says about a cluster's devices (of the drivers asked about).

    - `by_pod`: per pod (namespace, name), the ids of the devices it holds, sorted. Only pods
      holding any are present.
    - `published`: per node, the devices its slices publish, by id.
    - `allocated`: per node, the ids of devices allocated to any claim, whoever it is reserved
      for (pods Wingsmith manages, others, or nobody yet).
    - `skipped`: what was passed over or read with a fallback, and why.
    """

    by_pod: Mapping[PodKey, tuple[str, ...]]
    published: Mapping[str, Mapping[str, Device]]
    allocated: Mapping[str, frozenset[str]]
    skipped: tuple[Skipped, ...]

    def held_outside(self, managed: Iterable[PodKey]) -> dict[str, frozenset[str]]:
        """Per node, the allocated devices that none of the `managed` pods holds: those taken
        by other pods, or by claims not (yet) reserved for any pod. A device shared by a
        managed pod and another is Wingsmith's, not outside. Nodes with none are left out."""
        mine: set[str] = set()
        for pod in managed:
            mine.update(self.by_pod.get(pod, ()))
        outside = {node: ids - mine for node, ids in self.allocated.items()}
        return {node: ids for node, ids in outside.items() if ids}


def dra_devices(
    pods: Iterable[Obj],
    claims: Iterable[Obj],
    slices: Iterable[Obj],
    *,
    drivers: Collection[str] = (NVIDIA_GPU_DRIVER,),
) -> DraDevices:
    """Join pods, ResourceClaims and ResourceSlices (Kubernetes JSON, any served version).

    Device ids: a device's `uuid` attribute (`uuid`, or `<driver>/uuid` fully qualified), else
    `<driver>/<pool>/<device>`: a device without one (another vendor's, or a MIG partition
    NVIDIA publishes before creating it), or one an allocation names that its pool's newest
    slices do not publish (reported as `unpublished_device`).

    A pod holds the devices allocated to a claim that is reserved for it (`reservedFor` names
    the pod; by uid when both carry one, so a reservation for an earlier pod of the same name
    does not count) or that its `resourceClaimStatuses` names (a claim made from a template,
    also before it is reserved). A claim several pods use gives its devices to each. A result
    with `adminAccess` (a monitoring agent's view of a device others use) holds nothing.

    Slices: only a pool's newest `generation` counts (the rule the API sets for consumers);
    a device's node is its own `nodeName`, else its slice's. Only `drivers` are read.
    """
    skipped: list[Skipped] = []
    wanted = frozenset(drivers)
    devices = _published(slices, wanted, skipped)
    index = _PodIndex(pods, skipped)
    held: dict[PodKey, set[str]] = defaultdict(set)
    allocated: dict[str, set[str]] = defaultdict(set)
    for claim in claims:
        for device, holders in _claim_devices(claim, wanted, devices, index, skipped):
            for pod in holders:
                held[pod].add(device.id)
            node = device.node or _only({index.node.get(p) for p in holders} - {None})
            if node is not None:
                allocated[node].add(device.id)
    published: dict[str, dict[str, Device]] = defaultdict(dict)
    for device in sorted(devices.values(), key=lambda d: d.id):
        if device.node is not None:
            published[device.node].setdefault(device.id, device)
    return DraDevices(
        by_pod={pod: tuple(sorted(ids)) for pod, ids in held.items()},
        published=dict(published),
        allocated={node: frozenset(ids) for node, ids in allocated.items()},
        skipped=tuple(skipped),
    )


# --- pods --------------------------------------------------------------------------------------


class _PodIndex:
    """Pods by key, with their uid and node, and which claims their statuses name."""

    def __init__(self, pods: Iterable[Obj], skipped: list[Skipped]) -> None:
        self.uid: dict[PodKey, str | None] = {}
        self.node: dict[PodKey, str | None] = {}
        self.naming: dict[tuple[str, str], set[PodKey]] = defaultdict(set)  # claim -> pods
        for pod in pods:
            try:
                self._add(pod, skipped)
            except _Malformed as e:
                skipped.append(e.skipped("Pod", pod))

    def _add(self, pod: Obj, skipped: list[Skipped]) -> None:
        meta = _required(pod, "metadata", dict)
        key = (_required(meta, "namespace", str), _required(meta, "name", str))
        uid = _optional(meta, "uid", str)
        node = _optional(_optional(pod, "spec", dict) or {}, "nodeName", str)
        status = _optional(pod, "status", dict) or {}
        self.uid[key], self.node[key] = uid, node
        for entry in _items(status, "resourceClaimStatuses", "Pod", pod, skipped):
            try:
                claim = _optional(entry, "resourceClaimName", str)
            except _Malformed as e:
                skipped.append(e.skipped("Pod", pod))
                continue
            if claim:  # none: that entry needed no claim
                self.naming[(key[0], claim)].add(key)

    def reserved(self, namespace: str, consumer: Obj) -> PodKey | None:
        """The pod a `reservedFor` entry names, if it is one of these pods."""
        if _optional(consumer, "resource", str) != "pods" or consumer.get("apiGroup"):
            return None  # another kind of consumer (a workload's PodGroup, say)
        key = (namespace, _required(consumer, "name", str))
        if key not in self.uid:
            return None
        uid, mine = _optional(consumer, "uid", str), self.uid[key]
        return key if uid is None or mine is None or uid == mine else None


# --- claims ------------------------------------------------------------------------------------


def _claim_devices(
    claim: Obj,
    wanted: frozenset[str],
    devices: Mapping[DeviceKey, Device],
    pods: _PodIndex,
    skipped: list[Skipped],
) -> Iterator[tuple[Device, frozenset[PodKey]]]:
    """Each device of `wanted` drivers allocated to the claim, with the pods that hold it."""
    try:
        meta = _required(claim, "metadata", dict)
        namespace, name = _required(meta, "namespace", str), _required(meta, "name", str)
        status = _optional(claim, "status", dict) or {}
        allocation = _optional(status, "allocation", dict)
        if allocation is None:
            return  # not allocated yet: nothing is held
        results = _optional(_optional(allocation, "devices", dict) or {}, "results", list) or []
    except _Malformed as e:
        skipped.append(e.skipped("ResourceClaim", claim))
        return
    holders = set(pods.naming.get((namespace, name), ()))
    for consumer in _items(status, "reservedFor", "ResourceClaim", claim, skipped):
        try:
            pod = pods.reserved(namespace, consumer)
        except _Malformed as e:
            skipped.append(e.skipped("ResourceClaim", claim))
            continue
        if pod is not None:
            holders.add(pod)
    for result in results:
        try:
            device = _allocated(result, wanted, devices)
        except _Malformed as e:
            skipped.append(e.skipped("ResourceClaim", claim))
            continue
        if device is None:
            continue
        if (device.driver, device.pool, device.name) not in devices:
            detail = f"{device.id} is not in the newest slices of its pool"
            skipped.append(_skipped("ResourceClaim", claim, Oddity.UNPUBLISHED_DEVICE, detail))
        yield device, frozenset(holders)


def _allocated(
    result: Any, wanted: frozenset[str], devices: Mapping[DeviceKey, Device]
) -> Device | None:
    """The device one allocation result names; None for another driver's or admin access."""
    if not isinstance(result, dict):
        raise _Malformed("an allocation result is not an object")
    driver = _required(result, "driver", str)
    if driver not in wanted or _optional(result, "adminAccess", bool):
        return None
    key = (driver, _required(result, "pool", str), _required(result, "device", str))
    published = devices.get(key)
    if published is not None:
        return published
    return Device("/".join(key), driver, key[1], key[2], None, None)


# --- slices ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slice:
    obj: Obj
    spec: Obj
    driver: str
    pool: str
    generation: int
    count: int | None  # resourceSliceCount


def _published(
    slices: Iterable[Obj], wanted: frozenset[str], skipped: list[Skipped]
) -> dict[DeviceKey, Device]:
    """Every device the newest generation of each pool publishes, by (driver, pool, name)."""
    read: list[_Slice] = []
    newest: dict[tuple[str, str], int] = {}
    for obj in slices:
        try:
            s = _read_slice(obj)
        except _Malformed as e:
            skipped.append(e.skipped("ResourceSlice", obj))
            continue
        if s.driver in wanted:
            read.append(s)
            pool = (s.driver, s.pool)
            newest[pool] = max(newest.get(pool, s.generation), s.generation)
    current = [s for s in read if s.generation == newest[(s.driver, s.pool)]]
    devices: dict[DeviceKey, Device] = {}
    for s in current:
        for device in _slice_devices(s, skipped):
            key = (device.driver, device.pool, device.name)
            if key in devices:
                detail = f"{'/'.join(key)} is published twice"
                skipped.append(_skipped("ResourceSlice", s.obj, Oddity.DUPLICATE_DEVICE, detail))
                continue
            devices[key] = device
    _check_complete(current, skipped)
    return devices


def _read_slice(obj: Obj) -> _Slice:
    spec = _required(obj, "spec", dict)
    pool = _required(spec, "pool", dict)
    return _Slice(
        obj,
        spec,
        _required(spec, "driver", str),
        _required(pool, "name", str),
        _required(pool, "generation", int),
        _optional(pool, "resourceSliceCount", int),
    )


def _slice_devices(s: _Slice, skipped: list[Skipped]) -> Iterator[Device]:
    try:
        node = _optional(s.spec, "nodeName", str) or None
    except _Malformed as e:
        skipped.append(e.skipped("ResourceSlice", s.obj))
        return
    for item in _items(s.spec, "devices", "ResourceSlice", s.obj, skipped):
        try:
            yield _device(item, s, node, skipped)
        except _Malformed as e:
            skipped.append(e.skipped("ResourceSlice", s.obj))


def _device(item: Obj, s: _Slice, node: str | None, skipped: list[Skipped]) -> Device:
    name = _required(item, "name", str)
    # v1beta1 keeps a device's fields under `basic`; v1beta2 and v1 have them on the device
    body = _optional(item, "basic", dict) or item
    attributes = _optional(body, "attributes", dict) or {}
    own_node = _optional(body, "nodeName", str) or node
    ids: dict[str, str | None] = {}
    for attribute in (UUID_ATTRIBUTE, TYPE_ATTRIBUTE):
        try:
            ids[attribute] = _string_attribute(attributes, s.driver, attribute)
        except _Malformed as e:
            skipped.append(e.skipped("ResourceSlice", s.obj))
            ids[attribute] = None
    uuid = ids[UUID_ATTRIBUTE] or f"{s.driver}/{s.pool}/{name}"
    return Device(uuid, s.driver, s.pool, name, own_node, ids[TYPE_ATTRIBUTE])


def _string_attribute(attributes: Obj, driver: str, name: str) -> str | None:
    """A string attribute, named plainly (the driver's own) or fully qualified."""
    value = attributes.get(name, attributes.get(f"{driver}/{name}"))
    if value is None:
        return None
    text = value.get("string") if isinstance(value, dict) else None
    if not isinstance(text, str) or not text:
        raise _Malformed(f"attribute {name!r} is not a string: {str(value)[:80]}")
    return text


def _check_complete(current: list[_Slice], skipped: list[Skipped]) -> None:
    """A pool whose newest generation has fewer slices than it says is still being written
    (or lost one): its devices are used as seen, and said."""
    seen: dict[tuple[str, str], list[_Slice]] = defaultdict(list)
    for s in current:
        seen[(s.driver, s.pool)].append(s)
    for (driver, pool), group in seen.items():
        expected = max((s.count or 0) for s in group)
        if len(group) < expected:
            detail = f"pool {driver}/{pool} has {len(group)} of {expected} slices"
            skipped.append(_skipped("ResourceSlice", group[0].obj, Oddity.INCOMPLETE_POOL, detail))


# --- reading JSON that may be anything ---------------------------------------------------------


class _Malformed(Exception):
    """A field is missing or of the wrong type; caught by whoever reads the object."""

    def skipped(self, kind: str, obj: Any) -> Skipped:
        return _skipped(kind, obj, Oddity.MALFORMED, str(self))


def _skipped(kind: str, obj: Any, oddity: Oddity, detail: str) -> Skipped:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    namespace, name = meta.get("namespace"), meta.get("name")
    return Skipped(
        kind,
        namespace if isinstance(namespace, str) else "",
        name if isinstance(name, str) else "?",
        oddity,
        detail,
    )


def _optional(obj: Obj, key: str, kind: type[T]) -> T | None:
    """`obj[key]` when it is a `kind`, None when absent or null; anything else is malformed."""
    if not isinstance(obj, Mapping):
        raise _Malformed(f"not an object where {key} was looked for")
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Malformed(f"{key} is not a {kind.__name__}: {str(value)[:80]}")
    return value


def _required(obj: Obj, key: str, kind: type[T]) -> T:
    value = _optional(obj, key, kind)
    if value is None or value == "":
        raise _Malformed(f"{key} is missing")
    return value


def _items(obj: Obj, key: str, kind: str, whole: Obj, skipped: list[Skipped]) -> Iterator[Obj]:
    """The objects of a list field; a list that is not one, or an item that is not an object,
    is noted and passed over."""
    try:
        items = _optional(obj, key, list) or []
    except _Malformed as e:
        skipped.append(e.skipped(kind, whole))
        return
    for item in items:
        if isinstance(item, dict):
            yield item
        else:
            skipped.append(_Malformed(f"an item of {key} is not an object").skipped(kind, whole))


def _only(values: set[str | None]) -> str | None:
    """The one value, or None when there are none or several."""
    return next(iter(values)) if len(values) == 1 else None


__all__ = [
    "NVIDIA_GPU_DRIVER",
    "Device",
    "DraDevices",
    "Oddity",
    "PodKey",
    "Skipped",
    "dra_devices",
]
