"""Fleet views: workload phase, free device capacity (per cluster and device class, and per
node), quota use, deployment health, discovered inventory, allocations, and the workloads and
clusters as declared. Each is a pure fold (see `base.Projection`). A deleted workload's or
deployment's views are removed; the devices its replicas hold stay counted until they are seen
terminated. Capacity and quota use count as admission does (domain/admission.py)."""

from __future__ import annotations

import abc
from collections.abc import Container, Iterable, Mapping
from operator import itemgetter
from typing import Any, ClassVar, Literal, NamedTuple, TypeVar, cast

from typing_extensions import TypedDict, Unpack

from wingsmith.domain.cluster import (
    ClusterReachable,
    ClusterRegistered,
    ClusterUnreachable,
    InventoryReported,
    OperatorConnected,
)
from wingsmith.domain.contracts import views as v
from wingsmith.domain.deployment import (
    HOLDS,
    PARTIAL,
    AdmissionDecided,
    AdmissionPhase,
    AdmissionReason,
    Authority,
    AuthorityPromoted,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentDisabled,
    DeploymentEnabled,
    DeploymentFailed,
    DeploymentPlaced,
    DeploymentRunning,
    DeploymentScaled,
    EngineArgsSet,
    FailureCleared,
    ImportedArgsObserved,
    LiveDigestsObserved,
    ServingConfigChanged,
    StatusObserved,
)
from wingsmith.domain.discovery import (
    DiscoveryIgnored,
    DiscoveryPromoted,
    DiscoveryResighted,
    DiscoverySighted,
    DiscoveryState,
    DiscoveryTracked,
    DiscoveryVanished,
)
from wingsmith.domain.placement import Preferences
from wingsmith.domain.project import QuotaSet
from wingsmith.domain.replica import (
    ReplicaNotReady,
    ReplicaReady,
    ReplicaStarted,
    ReplicaTerminated,
)
from wingsmith.domain.values import holds_stand_ins
from wingsmith.domain.workload import (
    MOVES_KEPT,
    DeploymentAttached,
    PlacementDeferred,
    PlacementPreferencesChanged,
    WorkloadCreated,
    WorkloadDeleted,
    WorkloadMoved,
    WorkloadScaled,
    WorkloadServingConfigAmended,
    WorkloadServingConfigChanged,
)
from wingsmith.projections.base import Keys, Projection, View, handles
from wingsmith.projections.render import Render

E = Mapping[str, Any]
RANK: dict[str, int] = {
    AdmissionPhase.PENDING: 0,
    AdmissionPhase.ADMITTED: 1,
    AdmissionPhase.PLACED: 2,
    AdmissionPhase.RUNNING: 3,
}
DEGRADING = frozenset({"desired_replicas", "enabled"})  # what `degraded` is judged from
DRIFTING = frozenset({"authority", "engine_args", "imported_args"})  # ... and `drift`
_CLASS_AND_DEVICES = itemgetter("device_class", "devices")
_NODE_AND_DOMAIN = itemgetter("node_id", "topology_domain")
Row = TypeVar("Row")  # the view document of an `_Allocations`
HeldRow = TypeVar("HeldRow", v.CapacityRow, v.QuotaUseRow)  # ... of a `_Holdings`


def _first_phase(e: E) -> tuple[str, str | None]:
    """A deployment the plane declares waits for admission; one adopted runs already."""
    if e["authority"] == Authority.MANAGED:
        return AdmissionPhase.PENDING, AdmissionReason.AWAITING_ADMISSION
    return AdmissionPhase.ADMITTED, None


def _devices(nodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Total devices per device class of an inventory's nodes."""
    totals: dict[str, int] = {}
    for device_class, devices in map(_CLASS_AND_DEVICES, nodes):
        totals[device_class] = totals.get(device_class, 0) + devices
    return totals


def workload_phase(phases: Iterable[str]) -> str:
    """running if all deployments are; failed if any failed; else the least advanced phase."""
    phases = list(phases)
    if not phases:
        return AdmissionPhase.PENDING
    if AdmissionPhase.FAILED in phases:
        return AdmissionPhase.FAILED
    return min(phases, key=RANK.__getitem__)


def _workload_phase(deployments: Mapping[str, str], idle: Container[str]) -> str:
    """The workload's phase over the deployments that have a share of its replicas, or over
    all of them when none has (a workload scaled to zero): one whose share went to 0 when the
    workload shrank holds nothing back, wherever admission leaves it."""
    busy = [phase for d, phase in deployments.items() if d not in idle]
    return workload_phase(busy or deployments.values())


def _name(workload_id: str, e: E) -> tuple[str, int]:
    """A workload's name and incarnation; one created before names were reused has neither
    recorded: its name is its id, and it is the first."""
    return e.get("name") or workload_id, e.get("incarnation", 1)


class WorkloadPhase(Projection[v.WorkloadPhaseView]):
    """Key: workload name. The phase of the name's current incarnation (`workload_id`), with
    each of its deployments' phases beside it."""

    name = v.WORKLOAD_PHASE.name
    # 2: a deployment whose share is 0 holds the workload's phase back no more
    # 3: keyed by name, with the incarnation's id and number
    version = 3

    def __init__(self) -> None:
        super().__init__()
        self.workload_of: dict[str, str] = {}  # deployment id -> workload id
        self.name_of: dict[str, str] = {}  # workload id -> name, while it is not deleted
        self.idle: dict[str, None] = {}  # deployments whose share is 0 replicas

    def _view(self, workload_id: str) -> v.WorkloadPhaseView:
        name = self.name_of.setdefault(workload_id, workload_id)
        view = self.views.get(name)
        if view is None:
            view = self.views[name] = {
                "workload_id": workload_id,
                "name": name,
                "incarnation": 1,
                "phase": AdmissionPhase.PENDING,
                "deployments": {},
            }
        return view

    @handles(WorkloadCreated)
    def _workload(self, workload_id: str, e: E) -> Keys:
        name, incarnation = _name(workload_id, e)
        self.name_of[workload_id] = name
        self._view(workload_id)["incarnation"] = incarnation
        return (name,)

    @handles(DeploymentCreated)
    def _deployment(self, deployment_id: str, e: E) -> Keys:
        self.workload_of[deployment_id] = e["workload_id"]
        self._share(deployment_id, e["desired_replicas"])
        return self._set(deployment_id, _first_phase(e)[0])

    @handles(DeploymentScaled)
    def _scaled(self, deployment_id: str, e: E) -> Keys:
        was = deployment_id in self.idle
        self._share(deployment_id, e["desired_replicas"])
        if was == (deployment_id in self.idle) or deployment_id not in self.workload_of:
            return ()
        view = self._view(self.workload_of[deployment_id])
        view["phase"] = _workload_phase(view["deployments"], self.idle)
        return (view["name"],)

    def _share(self, deployment_id: str, replicas: int) -> None:
        if replicas:
            self.idle.pop(deployment_id, None)
        else:
            self.idle[deployment_id] = None

    @handles(AdmissionDecided)
    def _decided(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, e["phase"])

    @handles(DeploymentPlaced)
    def _placed(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, AdmissionPhase.PLACED)

    @handles(DeploymentRunning)
    def _running(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, AdmissionPhase.RUNNING)

    @handles(DeploymentFailed)
    def _failed(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, AdmissionPhase.FAILED)

    @handles(FailureCleared)
    def _cleared(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, AdmissionPhase.PENDING)

    @handles(WorkloadDeleted)
    def _deleted(self, workload_id: str, e: E) -> Keys:
        """The name's view goes; a new incarnation of the name starts another."""
        name = self.name_of.pop(workload_id, workload_id)
        view = self.views.get(name)
        if view is None or view["workload_id"] != workload_id:
            return ()
        del self.views[name]
        for deployment_id in view["deployments"]:
            self.workload_of.pop(deployment_id, None)
            self.idle.pop(deployment_id, None)
        return (name,)

    def _set(self, deployment_id: str, phase: str) -> Keys:
        workload_id = self.workload_of[deployment_id]  # a deleted deployment's phase never moves
        view = self._view(workload_id)
        view["deployments"][deployment_id] = phase
        view["phase"] = _workload_phase(view["deployments"], self.idle)
        return (view["name"],)


class _Allocations(Projection[Row]):
    """Shared bookkeeping: which deployment is where, and how many devices each live replica
    holds. Subclasses say what a replica taking or releasing devices changes (`_held`)."""

    def __init__(self) -> None:
        super().__init__()
        self.deployments: dict[str, dict[str, Any]] = {}
        self.replicas: dict[str, tuple[str, int]] = {}  # replica -> (deployment, devices held)

    @handles(DeploymentCreated)
    def _track_deployment(self, deployment_id: str, e: E) -> Keys:
        self.deployments[deployment_id] = {
            "id": deployment_id,
            "cluster_id": e["cluster_id"],
            "project": e["project"],
            "device_class": e["device_class"],
            "granted": 0,
            "allocated": 0,
            "reserved": 0,  # what its grant reserves beyond its replicas, as last counted
        }
        return self._deployment_changed(deployment_id)

    @handles(ReplicaStarted)
    def _started(self, replica_id: str, e: E) -> Keys:
        deployment_id, devices = self.replicas[replica_id] = (
            e["deployment_id"],
            len(e["device_ids"]),
        )
        deployment = self.deployments.get(deployment_id)
        if deployment is None:  # a replica of a deployment this plane does not know
            return ()
        return self._held(replica_id, deployment, devices, e)

    @handles(ReplicaTerminated)
    def _terminated(self, replica_id: str, e: E) -> Keys:
        held = self.replicas.pop(replica_id, None)
        if held is None:
            return ()
        deployment = self.deployments.get(held[0])
        if deployment is None:
            return ()
        return self._held(replica_id, deployment, -held[1], None)

    def _held(
        self, replica_id: str, deployment: dict[str, Any], devices: int, started: E | None
    ) -> Keys:
        """A replica of `deployment` took `devices` (`started` is its event) or, when
        negative, released them."""
        return ()

    def _deployment_changed(self, deployment_id: str) -> Keys:
        return ()


class _Holdings(_Allocations[HeldRow], abc.ABC):
    """What each deployment holds, as admission counts it (domain/admission.py `Slot.held`):
    its grant, or what its live replicas hold when that is more. Split into `allocated` (its
    live replicas) and `reserved` (the rest of its grant), and counted in the deployment's row
    (`_move`) by the difference each change makes, so a replica started or terminated costs
    the same however many deployments share the row."""

    row_by: ClassVar[str]  # the deployment's field that, with its device class, keys its row

    @handles(AdmissionDecided)
    def _admission(self, deployment_id: str, e: E) -> Keys:
        d = self.deployments[deployment_id]
        d["granted"] = e.get("devices", 0)
        return self._recount(d)

    @handles(DeploymentFailed, DeploymentDeleted)
    def _released(self, deployment_id: str, e: E) -> Keys:
        """A failure or a deletion releases the grant; live replicas keep what they hold."""
        d = self.deployments[deployment_id]
        d["granted"] = 0
        return self._recount(d)

    def _held(
        self, replica_id: str, deployment: dict[str, Any], devices: int, started: E | None
    ) -> Keys:
        """The hot path of a rebuild: every replica started or terminated comes here."""
        allocated = deployment["allocated"] = deployment["allocated"] + devices
        reserved = deployment["granted"] - allocated
        if reserved < 0:
            reserved = 0
        moved = reserved - deployment["reserved"]
        deployment["reserved"] = reserved
        return self._move(deployment, moved, devices)

    def _deployment_changed(self, deployment_id: str) -> Keys:
        d = self.deployments[deployment_id]
        d["row"] = f"{d[self.row_by]}.{d['device_class']}"
        return self._recount(d)

    def _recount(self, d: dict[str, Any]) -> Keys:
        """Move this deployment's share of its row by the change in what its grant reserves
        beyond what its replicas hold."""
        reserved = d["granted"] - d["allocated"]
        if reserved < 0:
            reserved = 0
        moved = reserved - d["reserved"]
        if not moved:
            return self._unmoved(d)
        d["reserved"] = reserved
        return self._move(d, moved, 0)

    @abc.abstractmethod
    def _move(self, d: dict[str, Any], reserved: int, allocated: int) -> Keys:
        """Add to the deployment's row (`d["row"]`, made if it is new) what it now reserves
        and allocates more, and take it from what the row has left."""

    def _unmoved(self, d: dict[str, Any]) -> Keys:
        """A change that moved none of the deployment's counts."""
        return ()


NodeEntry = tuple[str, int, bool, int]  # a reported node: class, devices, unschedulable, outside


def _node_entries(nodes: Iterable[Mapping[str, Any]]) -> dict[str, NodeEntry]:
    """What a node's capacity view keeps of each reported node, by name. A node leaves out
    `unschedulable` and `held_outside` while they say nothing (domain/cluster.py), as every
    node did before they were added."""
    return {
        node["node_id"]: (
            node["device_class"],
            node["devices"],
            node.get("unschedulable", False),
            node.get("held_outside", 0),
        )
        for node in nodes
    }


class InventorySums(NamedTuple):
    """A device class's devices on a cluster as its inventory reports them."""

    total: int = 0
    unschedulable: int = 0  # on nodes cordoned or not Ready
    held_outside: int = 0  # by pods Wingsmith does not manage, on the other nodes


def _sums(nodes: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """`InventorySums` per device class of an inventory's nodes (lists: they checkpoint as
    they are)."""
    sums: dict[str, list[int]] = {}
    for node in nodes:
        device_class, devices = _CLASS_AND_DEVICES(node)
        counted = sums.get(device_class)
        if counted is None:
            counted = sums[device_class] = [0, 0, 0]
        counted[0] += devices
        if node.get("unschedulable"):
            counted[1] += devices
        else:
            counted[2] += node.get("held_outside", 0)
    return sums


class Capacity(_Holdings[v.CapacityRow]):
    """Key: `<cluster>.<device class>`. Free devices on admission's basis: what the nodes can
    take (their devices, less those on unschedulable nodes and those held outside Wingsmith)
    less what every deployment holds (allocated, reserved). Devices in live allocations are
    never free; a deployment reserves what admission granted it and its replicas do not hold
    yet (during a rollout the grant covers the old generation and the new one together). Free
    is not clamped: a negative free is an over-commitment, e.g. replicas on a node cordoned or
    lost since they started."""

    name = v.CAPACITY.name
    version = 2  # 2: unschedulable, held_outside; free on admission's basis, never clamped
    row_by = "cluster_id"

    def __init__(self) -> None:
        super().__init__()
        self.inventory: dict[str, dict[str, list[int]]] = {}  # cluster -> class -> sums

    def _row(self, cluster_id: str, device_class: str) -> tuple[str, v.CapacityRow]:
        key = f"{cluster_id}.{device_class}"
        row = self.views.get(key)
        if row is None:
            row = self.views[key] = {
                "cluster_id": cluster_id,
                "device_class": device_class,
                "total": 0,
                "unschedulable": 0,
                "held_outside": 0,
                "allocated": 0,
                "reserved": 0,
                "free": 0,
            }
        return key, row

    @handles(InventoryReported)
    def _inventory(self, cluster_id: str, e: E) -> Keys:
        """Only the device classes whose sums moved change (a class no longer reported has
        none)."""
        sums = _sums(e["nodes"])
        before = self.inventory.get(cluster_id, {})
        self.inventory[cluster_id] = sums
        if sums == before:  # most reports move no sum
            return ()
        changed = []
        for device_class in before.keys() | sums.keys():
            now = InventorySums(*sums.get(device_class, ()))
            if now != InventorySums(*before.get(device_class, ())):
                key, row = self._row(cluster_id, device_class)
                row["total"], row["unschedulable"], row["held_outside"] = now
                self._balance(row)
                changed.append(key)
        return changed

    def _move(self, d: dict[str, Any], reserved: int, allocated: int) -> Keys:
        key = d["row"]
        row = self.views.get(key)
        if row is None:
            key, row = self._row(d["cluster_id"], d["device_class"])
        row["reserved"] += reserved
        row["allocated"] += allocated
        row["free"] -= reserved + allocated
        return (key,)

    def _unmoved(self, d: dict[str, Any]) -> Keys:
        """A new deployment's cluster and class have a row, even before anything is held."""
        return () if d["row"] in self.views else (self._row(d["cluster_id"], d["device_class"])[0],)

    @staticmethod
    def _balance(row: v.CapacityRow) -> None:
        row["free"] = (
            row["total"]
            - row["unschedulable"]
            - row["held_outside"]
            - row["allocated"]
            - row["reserved"]
        )


class NodeCapacity(Projection[v.NodeCapacityView]):
    """Key: `<cluster>.<device class>.<node>`. Each node of a capacity row: what it can take
    and what live replicas hold on it (each `ReplicaStarted` names its node). A view of its own
    per node keeps the capacity rows small on clusters of hundreds of nodes, and a replica
    started or terminated changes one node's view. A node stays while it is reported or
    replicas hold devices on it."""

    name = v.CAPACITY_NODES.name

    def __init__(self) -> None:
        super().__init__()
        # cluster -> node -> (device class, devices, unschedulable, held outside)
        self.inventory: dict[str, dict[str, NodeEntry]] = {}
        self.row_of: dict[str, str] = {}  # deployment -> `<cluster>.<device class>`
        self.counted_on: dict[str, tuple[str, int]] = {}  # live replica -> (view, devices)

    def restore(self, state: Mapping[str, Any]) -> None:
        """A checkpoint keeps the inventory's entries as lists: tuples again, so the next
        report compares equal where nothing moved."""
        super().restore(state)
        for nodes in self.inventory.values():
            for node_id, entry in nodes.items():
                nodes[node_id] = cast(NodeEntry, tuple(entry))

    @handles(DeploymentCreated)
    def _deployment(self, deployment_id: str, e: E) -> Keys:
        self.row_of[deployment_id] = f"{e['cluster_id']}.{e['device_class']}"
        return ()

    @handles(ReplicaStarted)
    def _started(self, replica_id: str, e: E) -> Keys:
        devices = len(e["device_ids"])
        row = self.row_of.get(e["deployment_id"])
        if row is None or not devices:  # unknown here, or a pod that holds no device
            return ()
        key = f"{row}.{e['node_id']}"
        self.counted_on[replica_id] = (key, devices)
        return self._hold(key, devices)

    @handles(ReplicaTerminated)
    def _terminated(self, replica_id: str, e: E) -> Keys:
        counted = self.counted_on.pop(replica_id, None)
        return () if counted is None else self._hold(counted[0], -counted[1])

    def _hold(self, key: str, devices: int) -> Keys:
        """Live replicas took `devices` on a node (released them, when negative)."""
        view = self.views.get(key)
        if view is None:  # a node not reported (any more): its replicas still hold devices
            cluster_id, device_class, node_id = key.split(".", 2)  # ids and classes: no dots
            view = self.views[key] = self._node(cluster_id, device_class, node_id)
        view["allocated"] += devices
        view["free"] -= devices
        if not view["allocated"] and not self._reported(view):
            del self.views[key]
        return (key,)

    @handles(InventoryReported)
    def _inventory(self, cluster_id: str, e: E) -> Keys:
        """Only the nodes that moved change."""
        after = _node_entries(e["nodes"])
        before = self.inventory.get(cluster_id, {})
        self.inventory[cluster_id] = after
        if after == before:
            return ()
        changed = []
        for node_id, now in after.items():
            was = before.get(node_id)
            if was == now:
                continue
            if was is not None and was[0] != now[0]:  # gone from its class to another
                changed.append(self._report(cluster_id, was[0], node_id, None))
            changed.append(self._report(cluster_id, now[0], node_id, now))
        for node_id in before.keys() - after.keys():  # gone
            changed.append(self._report(cluster_id, before[node_id][0], node_id, None))
        return changed

    def _report(
        self, cluster_id: str, device_class: str, node_id: str, entry: NodeEntry | None
    ) -> str:
        """Set a node's reported devices (None: it is not reported in this class any more)."""
        key = f"{cluster_id}.{device_class}.{node_id}"
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = self._node(cluster_id, device_class, node_id)
        if entry is None:
            view["devices"], view["unschedulable"], view["held_outside"] = 0, True, 0
        else:
            _, view["devices"], view["unschedulable"], view["held_outside"] = entry
        return self._balance(key, view)

    @staticmethod
    def _node(cluster_id: str, device_class: str, node_id: str) -> v.NodeCapacityView:
        """A node not (yet) reported: it has no devices to offer."""
        return {
            "cluster_id": cluster_id,
            "device_class": device_class,
            "node_id": node_id,
            "devices": 0,
            "unschedulable": True,
            "held_outside": 0,
            "allocated": 0,
            "free": 0,
        }

    def _balance(self, key: str, view: v.NodeCapacityView) -> str:
        """Its free devices; a node neither reported nor held on is removed."""
        usable = 0 if view["unschedulable"] else view["devices"] - view["held_outside"]
        view["free"] = usable - view["allocated"]
        if not view["allocated"] and not self._reported(view):
            del self.views[key]
        return key

    def _reported(self, view: v.NodeCapacityView) -> bool:
        entry = self.inventory.get(view["cluster_id"], {}).get(view["node_id"])
        return entry is not None and entry[0] == view["device_class"]


class QuotaUse(_Holdings[v.QuotaUseRow]):
    """Key: `<project>.<device class>`. Use on admission's basis: what each of the project's
    deployments holds (its grant, or what its live replicas hold when that is more), so what
    is shown available is what admission would grant."""

    name = v.QUOTA_USE.name
    version = 2  # 2: grants count as used; allocated and reserved
    row_by = "project"

    def _row(self, project: str, device_class: str) -> tuple[str, v.QuotaUseRow]:
        key = f"{project}.{device_class}"
        row = self.views.get(key)
        if row is None:
            row = self.views[key] = {
                "project": project,
                "device_class": device_class,
                "quota": 0,
                "used": 0,
                "allocated": 0,
                "reserved": 0,
                "available": 0,
            }
        return key, row

    @handles(QuotaSet)
    def _quota(self, project: str, e: E) -> Keys:
        key, row = self._row(project, e["device_class"])
        row["quota"] = e["devices"]
        row["available"] = row["quota"] - row["used"]
        return (key,)

    def _move(self, d: dict[str, Any], reserved: int, allocated: int) -> Keys:
        key = d["row"]
        row = self.views.get(key)
        if row is None:
            key, row = self._row(d["project"], d["device_class"])
        row["reserved"] += reserved
        row["allocated"] += allocated
        row["used"] += reserved + allocated
        row["available"] -= reserved + allocated
        return (key,)


class AdmissionDetails(TypedDict, total=False):
    evidence: dict[str, int]
    message: str
    blocker: str


# the fields of a deployment's health that its events set one by one
HealthField = Literal[
    "desired_replicas",
    "enabled",
    "status",
    "live_digests",
    "generation",
    "serving_digest",
    "authority",
    "engine_args",
    "imported_args",
    "stale",
    "admission",
    "devices_per_replica",
    "granted_devices",
]


class DeploymentHealth(Projection[v.DeploymentHealthView]):
    """Key: deployment id. Desired against ready replicas, the cluster's status (null until the
    cluster reports), live digests, drift for observed deployments, and the admission phase with
    its reason and evidence (why a deployment is pending, as of any time). While its cluster is
    unreachable a deployment keeps its last status, flagged `stale`."""

    name = v.DEPLOYMENT_HEALTH.name
    # 2: the last decision's evidence stays in every phase after it; 3: grants, replicas
    # waiting, and the reason part of a grant waits for, kept while placed and running; the
    # project, device class and the blocker a deployment waits behind (for explain)
    version = 3

    def __init__(self) -> None:
        super().__init__()
        self.ready: dict[str, tuple[str, bool]] = {}  # replica id -> (deployment id, ready)
        self.ready_pods: dict[str, int] = {}  # deployment id -> its ready pods
        self.on_cluster: dict[str, list[str]] = {}  # cluster id -> deployment ids
        self.unreachable: dict[str, bool] = {}  # cluster id -> True (a set does not checkpoint)

    @handles(DeploymentCreated)
    def _created(self, deployment_id: str, e: E) -> Keys:
        phase, reason = _first_phase(e)
        self.views[deployment_id] = {
            "deployment_id": deployment_id,
            "workload_id": e["workload_id"],
            "cluster_id": e["cluster_id"],
            "project": e["project"],
            "device_class": e["device_class"],
            "desired_replicas": e["desired_replicas"],
            "ready_replicas": 0,
            "enabled": True,
            "degraded": False,
            "status": None,
            "live_digests": {},
            "authority": e["authority"],
            "generation": 1,
            "serving_digest": e["serving_digest"],
            "engine_args": list(e["engine_args"]),
            "imported_args": e["imported_args"],
            "drift": None,
            "stale": e["cluster_id"] in self.unreachable,
            "admission": self._admission(phase, reason, e),
            "devices_per_replica": e["serving"]["devices_per_replica"],
            "granted_devices": 0,
            "waiting_replicas": 0,
        }
        self.on_cluster.setdefault(e["cluster_id"], []).append(deployment_id)
        self._degraded(self.views[deployment_id])
        self._drift(self.views[deployment_id])
        return (deployment_id,)

    @handles(ClusterUnreachable)
    def _unreachable(self, cluster_id: str, e: E) -> Keys:
        self.unreachable[cluster_id] = True
        return self._stale(cluster_id, True)

    @handles(ClusterReachable)
    def _reachable(self, cluster_id: str, e: E) -> Keys:
        self.unreachable.pop(cluster_id, None)
        return self._stale(cluster_id, False)

    def _stale(self, cluster_id: str, stale: bool) -> Keys:
        changed = [
            d for d in self.on_cluster.get(cluster_id, ()) if self.views[d]["stale"] != stale
        ]
        for deployment_id in changed:
            self._set(deployment_id, "stale", stale)
        return changed

    @staticmethod
    def _admission(
        phase: str, reason: str | None, e: E, **details: Unpack[AdmissionDetails]
    ) -> v.Admission:
        return {"phase": phase, "reason": reason, "since": e["timestamp"], **details}

    @handles(AdmissionDecided)
    def _decided(self, deployment_id: str, e: E) -> Keys:
        details: AdmissionDetails = {"evidence": e["evidence"]}
        if e.get("blocker"):
            details["blocker"] = e["blocker"]
        admission = self._admission(e["phase"], e["reason"], e, **details)
        self._set(deployment_id, "granted_devices", e.get("devices", 0))
        return self._set(deployment_id, "admission", admission)

    @handles(DeploymentPlaced)
    def _placed(self, deployment_id: str, e: E) -> Keys:
        return self._moved(deployment_id, AdmissionPhase.PLACED, None, e)

    @handles(DeploymentRunning)
    def _running(self, deployment_id: str, e: E) -> Keys:
        return self._moved(deployment_id, AdmissionPhase.RUNNING, None, e)

    @handles(DeploymentFailed)
    def _failed(self, deployment_id: str, e: E) -> Keys:
        self._set(deployment_id, "granted_devices", 0)  # a failure releases the grant
        return self._moved(deployment_id, AdmissionPhase.FAILED, e["reason"], e, e["message"])

    @handles(FailureCleared)
    def _cleared(self, deployment_id: str, e: E) -> Keys:
        return self._moved(
            deployment_id, AdmissionPhase.PENDING, AdmissionReason.AWAITING_ADMISSION, e
        )

    def _moved(
        self, deployment_id: str, phase: str, reason: str | None, e: E, message: str | None = None
    ) -> Keys:
        """A phase the cluster moved the deployment to: the evidence of the last admission
        decision stays beside it (why it was granted what it holds, or why it waits), and so
        does the reason the part of a grant not given yet waits for."""
        details: AdmissionDetails = {}
        was = self.views[deployment_id]["admission"]
        if phase in HOLDS and was["phase"] in HOLDS and was["reason"] in PARTIAL:
            reason = was["reason"]
            if (blocker := was.get("blocker")) is not None:  # it still waits behind it
                details["blocker"] = blocker
        if (evidence := was.get("evidence")) is not None:
            details["evidence"] = evidence
        if message is not None:
            details["message"] = message
        return self._set(deployment_id, "admission", self._admission(phase, reason, e, **details))

    @handles(DeploymentDeleted)
    def _deleted(self, deployment_id: str, e: E) -> Keys:
        view = self.views.pop(deployment_id, None)
        self.ready_pods.pop(deployment_id, None)
        if view is not None:
            self.on_cluster[view["cluster_id"]].remove(deployment_id)
        return (deployment_id,)

    def _set(self, deployment_id: str, field: HealthField, value: Any) -> Keys:
        view = self.views.get(deployment_id)
        if view is None:
            return ()
        view[field] = value
        if field in DEGRADING:
            self._degraded(view)
        elif field in DRIFTING:
            self._drift(view)
        self._waiting(view)
        return (deployment_id,)

    @staticmethod
    def _waiting(d: v.DeploymentHealthView) -> None:
        """The replicas admission has not granted yet, of a managed deployment that wants
        them (not disabled, not failed)."""
        wants = (
            d["enabled"]
            and d["authority"] == Authority.MANAGED
            and d["admission"]["phase"] != AdmissionPhase.FAILED
        )
        granted = d["granted_devices"] // max(d["devices_per_replica"], 1)
        d["waiting_replicas"] = max(d["desired_replicas"] - granted, 0) if wants else 0

    @handles(DeploymentScaled)
    def _scaled(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "desired_replicas", e["desired_replicas"])

    @handles(DeploymentEnabled)
    def _enabled(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "enabled", True)

    @handles(DeploymentDisabled)
    def _disabled(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "enabled", False)

    @handles(StatusObserved)
    def _status(self, deployment_id: str, e: E) -> Keys:
        keys = self._set(deployment_id, "status", e["status"])
        self._ready(deployment_id)
        return keys

    @handles(LiveDigestsObserved)
    def _digests(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "live_digests", e["live_digests"])

    @handles(ServingConfigChanged)
    def _serving(self, deployment_id: str, e: E) -> Keys:
        self._set(deployment_id, "generation", e["generation"])
        self._set(deployment_id, "devices_per_replica", e["serving"]["devices_per_replica"])
        return self._set(deployment_id, "serving_digest", e["serving_digest"])

    @handles(AuthorityPromoted)
    def _promoted(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "authority", e["authority"])

    @handles(EngineArgsSet)
    def _engine_args(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "engine_args", list(e["engine_args"]))

    @handles(ImportedArgsObserved)
    def _imported_args(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, "imported_args", list(e["imported_args"]))

    @handles(ReplicaStarted)
    def _started(self, replica_id: str, e: E) -> Keys:
        self.ready[replica_id] = (e["deployment_id"], False)
        return ()

    @handles(ReplicaReady)
    def _replica_ready(self, replica_id: str, e: E) -> Keys:
        return self._readiness(replica_id, ready=True)

    @handles(ReplicaNotReady)
    def _replica_not_ready(self, replica_id: str, e: E) -> Keys:
        return self._readiness(replica_id, ready=False)

    @handles(ReplicaTerminated)
    def _replica_gone(self, replica_id: str, e: E) -> Keys:
        deployment_id, was = self.ready.pop(replica_id, ("", False))
        return self._count(deployment_id, was, ready=False)

    def _readiness(self, replica_id: str, *, ready: bool) -> Keys:
        deployment_id, was = self.ready.get(replica_id, ("", False))
        self.ready[replica_id] = (deployment_id, ready)
        return self._count(deployment_id, was, ready=ready)

    def _count(self, deployment_id: str, was: bool, *, ready: bool) -> Keys:
        """A pod of the deployment became ready, or stopped being ready."""
        if deployment_id not in self.views or was == ready:
            return ()
        pods = self.ready_pods.get(deployment_id, 0) + (1 if ready else -1)
        self.ready_pods[deployment_id] = max(pods, 0)
        return self._ready(deployment_id)

    def _ready(self, deployment_id: str) -> Keys:
        """Ready replicas are whole ones (a prefill and decode pair, all pods of a multinode
        worker), as the cluster's status counts them; its ready pods until it reports one."""
        view = self.views.get(deployment_id)
        if view is None:
            self.ready_pods.pop(deployment_id, None)
            return ()
        status = view["status"]
        pods = self.ready_pods.get(deployment_id, 0)
        view["ready_replicas"] = status["ready_replicas"] if status else pods
        self._degraded(view)
        return (deployment_id,)

    @staticmethod
    def _degraded(d: v.DeploymentHealthView) -> None:
        d["degraded"] = d["enabled"] and d["ready_replicas"] < d["desired_replicas"]

    @staticmethod
    def _drift(d: v.DeploymentHealthView) -> None:
        observed_drift = (
            d["authority"] == Authority.OBSERVED
            and d["imported_args"] is not None
            and d["imported_args"] != d["engine_args"]
        )
        d["drift"] = (
            {"engine_args": d["engine_args"], "imported_args": d["imported_args"]}
            if observed_drift
            else None
        )


class Discovered(Projection[v.DiscoveredView]):
    """Key: discovery id. Every sighting with its state; `listed` leaves out ignored ones."""

    name = v.DISCOVERED.name

    @handles(DiscoverySighted)
    def _sighted(self, discovery_id: str, e: E) -> Keys:
        sighting: v.Sighting = e["sighting"]
        self.views[discovery_id] = {
            "discovery_id": discovery_id,
            "cluster_id": e["cluster_id"],
            "state": DiscoveryState.SIGHTED,
            "workload_id": None,
            "present": True,
            **sighting,
        }
        return (discovery_id,)

    @handles(DiscoveryResighted)
    def _resighted(self, discovery_id: str, e: E) -> Keys:
        cast(View, self.views[discovery_id]).update(e["sighting"], present=True)
        return (discovery_id,)

    @handles(DiscoveryVanished)
    def _vanished(self, discovery_id: str, e: E) -> Keys:
        self.views[discovery_id]["present"] = False
        return (discovery_id,)

    @handles(DiscoveryTracked)
    def _tracked(self, discovery_id: str, e: E) -> Keys:
        self.views[discovery_id]["state"] = DiscoveryState.TRACKED
        return (discovery_id,)

    @handles(DiscoveryIgnored)
    def _ignored(self, discovery_id: str, e: E) -> Keys:
        self.views[discovery_id]["state"] = DiscoveryState.IGNORED
        return (discovery_id,)

    @handles(DiscoveryPromoted)
    def _promoted(self, discovery_id: str, e: E) -> Keys:
        self.views[discovery_id].update(
            {"state": DiscoveryState.PROMOTED, "workload_id": e["workload_id"]}
        )
        return (discovery_id,)

    def listed(self, *, include_ignored: bool = False) -> list[v.DiscoveredView]:
        return [
            d
            for d in self.views.values()
            if include_ignored or d["state"] != DiscoveryState.IGNORED
        ]


class Allocations(_Allocations[v.AllocationView]):
    """Key: replica id. A live replica: its pod name, which devices it holds, on which node
    and in which topology domain, whether it is ready, and the serving configuration and engine
    version it runs. A terminated replica's view is removed."""

    name = v.ALLOCATIONS.name
    version = 2  # 2: stand_in

    def __init__(self) -> None:
        super().__init__()
        self.domains: dict[str, dict[str, str | None]] = {}  # cluster -> node -> domain
        self.on_node: dict[str, list[str]] = {}  # `<cluster>/<node>` -> live replica ids

    @handles(InventoryReported)
    def _inventory(self, cluster_id: str, e: E) -> Keys:
        """Re-place only the replicas on nodes whose topology domain changed."""
        before = self.domains.get(cluster_id, {})
        after = dict(map(_NODE_AND_DOMAIN, e["nodes"]))
        self.domains[cluster_id] = after
        if after == before:  # most reports move no node
            return ()
        moved = [n for n in before.keys() | after.keys() if before.get(n) != after.get(n)]
        return {
            r
            for node in moved
            for r in self.on_node.get(f"{cluster_id}/{node}", ())
            if self._place(r)
        }

    def _held(
        self, replica_id: str, deployment: dict[str, Any], devices: int, started: E | None
    ) -> Keys:
        if started is None:  # terminated: its devices are free again
            view = self.views.pop(replica_id)
            node = f"{view['cluster_id']}/{view['node_id']}"
            self.on_node[node].remove(replica_id)
            if not self.on_node[node]:
                del self.on_node[node]
            return (replica_id,)
        cluster_id, node_id = deployment["cluster_id"], started["node_id"]
        self.views[replica_id] = {
            "replica_id": replica_id,
            "deployment_id": deployment["id"],
            "cluster_id": cluster_id,
            "name": started["name"],
            "node_id": node_id,
            "device_ids": list(started["device_ids"]),
            "stand_in": holds_stand_ins(started["device_ids"]),
            "topology_domain": self.domains.get(cluster_id, {}).get(node_id),
            "ready": False,
            "serving_digest": started["serving_digest"],
            "engine_version": started["engine_version"],
        }
        self.on_node.setdefault(f"{cluster_id}/{node_id}", []).append(replica_id)
        return (replica_id,)

    @handles(ReplicaReady)
    def _ready(self, replica_id: str, e: E) -> Keys:
        return self._mark(replica_id, ready=True)

    @handles(ReplicaNotReady)
    def _not_ready(self, replica_id: str, e: E) -> Keys:
        return self._mark(replica_id, ready=False)

    def _mark(self, replica_id: str, *, ready: bool) -> Keys:
        view = self.views.get(replica_id)
        if view is None or view["ready"] == ready:
            return ()
        view["ready"] = ready
        return (replica_id,)

    def _place(self, replica_id: str) -> bool:
        view = self.views[replica_id]
        domain = self.domains.get(view["cluster_id"], {}).get(view["node_id"])
        changed: bool = domain != view["topology_domain"]
        view["topology_domain"] = domain
        return changed


class Workloads(Projection[v.WorkloadView]):
    """Key: workload name. The name's current incarnation as declared: its id and number, what
    it serves, where it may go, the deployment it has on each cluster, why placement found
    nowhere to go (null once it did), its placement preferences and its last moves. For listing
    and reading workloads without the event store."""

    name = v.WORKLOADS.name
    version = 2  # 2: keyed by name, the incarnation; unplaced_reason, preferences, moves

    def __init__(self) -> None:
        super().__init__()
        self.name_of: dict[str, str] = {}  # workload id -> name, while it is not deleted

    @handles(WorkloadCreated)
    def _created(self, workload_id: str, e: E) -> Keys:
        name, incarnation = _name(workload_id, e)
        self.name_of[workload_id] = name
        allowed = e.get("allowed_clusters")
        self.views[name] = {
            "workload_id": workload_id,
            "name": name,
            "incarnation": incarnation,
            "project": e["project"],
            "device_class": e["device_class"],
            "replicas": e["replicas"],
            "serving": e["serving"],
            "serving_digest": e["serving_digest"],
            "cluster": e["cluster_pin"],
            "clusters": None if allowed is None else list(allowed),
            "engine_args": list(e.get("engine_args", ())),
            "deployments": {},
            "unplaced": None,
            "unplaced_reason": None,
            "preferences": _preferences(e.get("preferences")),
            "moves": [],
            "created_at": e["timestamp"],
            "updated_at": e["timestamp"],
        }
        return (name,)

    @handles(WorkloadScaled)
    def _scaled(self, workload_id: str, e: E) -> Keys:
        return self._set(workload_id, e, replicas=e["replicas"])

    @handles(WorkloadServingConfigChanged)
    def _serving(self, workload_id: str, e: E) -> Keys:
        return self._set(workload_id, e, serving=e["serving"], serving_digest=e["serving_digest"])

    @handles(WorkloadServingConfigAmended)
    def _amended(self, workload_id: str, e: E) -> Keys:
        return self._set(workload_id, e, serving=e["serving"])

    @handles(DeploymentAttached)
    def _attached(self, workload_id: str, e: E) -> Keys:
        view = self._current(workload_id)
        if view is not None:
            view["deployments"][e["cluster_id"]] = e["deployment_key"]
        return self._set(workload_id, e, unplaced=None, unplaced_reason=None)

    @handles(PlacementPreferencesChanged)
    def _preferences(self, workload_id: str, e: E) -> Keys:
        return self._set(workload_id, e, preferences=_preferences(e["preferences"]))

    @handles(WorkloadMoved)
    def _moved(self, workload_id: str, e: E) -> Keys:
        view = self._current(workload_id)
        if view is None:
            return ()
        move: v.MoveDocument = {
            "from_cluster": e["from_cluster"],
            "to_cluster": e["to_cluster"],
            "replicas": e["replicas"],
            "reason": e["reason"],
            "at": e["timestamp"],
        }
        return self._set(workload_id, e, moves=[*view["moves"], move][-MOVES_KEPT:])

    @handles(PlacementDeferred)
    def _deferred(self, workload_id: str, e: E) -> Keys:
        return self._set(workload_id, e, unplaced=e["message"], unplaced_reason=e.get("reason"))

    @handles(WorkloadDeleted)
    def _deleted(self, workload_id: str, e: E) -> Keys:
        """The name's view goes; a new incarnation of the name starts another."""
        if self._current(workload_id) is None:
            return ()
        name = self.name_of.pop(workload_id)
        del self.views[name]
        return (name,)

    def _current(self, workload_id: str) -> v.WorkloadView | None:
        """The view of the workload, while it is its name's current incarnation."""
        view = self.views.get(self.name_of.get(workload_id, workload_id))
        return view if view is not None and view["workload_id"] == workload_id else None

    def _set(self, workload_id: str, e: E, **fields: Any) -> Keys:
        view = self._current(workload_id)
        if view is None:
            return ()
        cast(View, view).update(fields, updated_at=e["timestamp"])  # a view document is a dict
        return (view["name"],)


def _preferences(given: E | None) -> v.PreferencesDocument:
    """The view's preferences: what the event says, every field given."""
    found = Preferences.model_validate(given or {})
    return {
        "preferred_clusters": list(found.preferred_clusters),
        "cluster_selector": dict(found.cluster_selector),
        "strategy": found.strategy.value,
    }


class Clusters(Projection[v.ClusterView]):
    """Key: cluster id. A cluster as registered, whether it is reachable, the operator last
    heard from, and its inventory in sum: how many nodes, and devices per class."""

    name = v.CLUSTERS.name

    @handles(ClusterRegistered)
    def _registered(self, cluster_id: str, e: E) -> Keys:
        self.views[cluster_id] = {
            "cluster_id": cluster_id,
            "region": e["region"],
            "labels": dict(e["labels"]),
            "reachable": True,
            "operator": None,
            "nodes": 0,
            "devices": {},
            "registered_at": e["timestamp"],
        }
        return (cluster_id,)

    @handles(InventoryReported)
    def _inventory(self, cluster_id: str, e: E) -> Keys:
        return self.update(cluster_id, nodes=len(e["nodes"]), devices=_devices(e["nodes"]))

    @handles(ClusterReachable)
    def _reachable(self, cluster_id: str, e: E) -> Keys:
        return self.update(cluster_id, reachable=True)

    @handles(ClusterUnreachable)
    def _unreachable(self, cluster_id: str, e: E) -> Keys:
        return self.update(cluster_id, reachable=False)

    @handles(OperatorConnected)
    def _operator(self, cluster_id: str, e: E) -> Keys:
        return self.update(cluster_id, operator=dict(e["operator"]))


PROJECTIONS: tuple[type[Projection[Any]], ...] = (
    WorkloadPhase,
    Capacity,
    NodeCapacity,
    QuotaUse,
    DeploymentHealth,
    Discovered,
    Allocations,
    Workloads,
    Clusters,
    Render,  # published on wingsmith.render.> for the operators, not wingsmith.proj.>
)
