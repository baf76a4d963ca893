"""Admission, with placement: which deployments may take devices, and which clusters a
workload's replicas go to (pure). docs/scheduling.md has the rules.

The ledger is a fold of the events that matter — quotas, inventories, reachability, workloads,
deployments and the devices their replicas hold — and it decides for one deployment, or places
one workload, at a time, however many events were folded before (the scheduler folds a whole
backlog, then decides once per deployment). Because it records each decision before it decides
again, two deployments can never both be given the last free devices.

What a deployment holds: what its admission granted, or what its replicas really hold when that
is more. What it wants: its replicas' footprint, plus what replicas of a previous serving
configuration still hold while it rolls out. Admission grants a deployment what it wants only
when, with everything the others hold, neither the cluster's devices of that class nor the
project's quota for it would be exceeded.

Order: deployments wait per cluster and per project, oldest first. One waiting for its cluster's
capacity, or its project's quota, keeps its place ahead of later ones (a large deployment is not
starved by small ones), unless it could never fit. A deployment is looked at again when
something it waits for changes: the cluster's inventory, its project's quota, or devices
released in its cluster or project; and then only the head of each queue is.

A deleted deployment is never admitted again, and its grant is released at once; what its live
replicas hold stays counted until they are seen terminated. A deleted workload is never placed.

Placement also moves what it placed (domain/moves.py reads the ledger for the moves due and
records them here as placements, so admission still decides for what moved). The ledger keeps
what that needs: clusters' labels, since when each unreachable one is, since when each
deployment waits (from the events' timestamps), and workloads' preferences.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from wingsmith.domain.base import Event
from wingsmith.domain.cluster import (
    ClusterReachable,
    ClusterRegistered,
    ClusterUnreachable,
    InventoryReported,
    OperatorConnected,
)
from wingsmith.domain.deployment import (
    HOLDS,
    PARTIAL,
    AdmissionDecided,
    AdmissionPhase,
    AdmissionReason,
    Authority,
    AuthorityPromoted,
    Deployment,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentDisabled,
    DeploymentEnabled,
    DeploymentFailed,
    DeploymentPlaced,
    DeploymentRunning,
    DeploymentScaled,
    FailureCleared,
    Limits,
    ServingConfigChanged,
    limits_of,
)
from wingsmith.domain.nodes import (
    MAX_NODES_PER_WORKER,
    pack,
    pods,
    room,
    smallest_pod,
    span,
    workers_per_replica,
)
from wingsmith.domain.placement import (
    Move,
    Preferences,
    RoomIndex,
    by_room,
    preferred_shares,
    shares,
)
from wingsmith.domain.project import QuotaSet
from wingsmith.domain.replica import ReplicaStarted, ReplicaTerminated
from wingsmith.domain.workload import (
    DeploymentAttached,
    MoveReason,
    PlacementPreferencesChanged,
    PlacementReason,
    WorkloadCreated,
    WorkloadDeleted,
    WorkloadMoved,
    WorkloadScaled,
    WorkloadServingConfigChanged,
)

WAITING_FOR_PREVIOUS = AdmissionReason.WAITING_FOR_PREVIOUS_GENERATION

Key = tuple[str, str]  # (cluster or project, device class)
E = Mapping[str, Any]
OnError = Callable[[str, Exception], None]  # (deployment or workload id, what it raised)
LedgerFold = Callable[["Ledger", str, E], list[str]]  # (ledger, aggregate id, event body)


def handles(*events: type[Event]) -> Callable[[LedgerFold], LedgerFold]:
    """Mark a ledger method as the fold of these events (`FOLDS` keys it by their names)."""

    def mark(method: LedgerFold) -> LedgerFold:
        method.__handles__ = events  # type: ignore[attr-defined]
        return method

    return mark


@dataclass(slots=True)
class Slot:
    """A deployment as admission sees it."""

    cluster: str
    project: str
    device_class: str
    per_replica: int
    desired: int
    digest: str  # the serving configuration it should run
    enabled: bool = True
    managed: bool = True
    phase: str = AdmissionPhase.PENDING
    reason: str | None = AdmissionReason.AWAITING_ADMISSION
    granted: int = 0  # devices its admission granted
    allocated: int = 0  # devices its live replicas hold
    by_digest: dict[str, int] = field(default_factory=dict)  # ... per serving configuration
    rolling: bool = False  # its serving configuration changed and was not admitted yet
    waiting_since: int = 0  # the position it began to wait at: its place in the queues
    retry: bool = False  # failed, then changed by the plane: admission starts over
    deleted: bool = False  # wants nothing, is decided for no more; holds what its replicas do
    workers: int = 1  # engine workers per replica: 2 when disaggregated
    short_on_nodes: bool = False  # last refused because its pods did not fit the nodes
    limits: Limits = (None, None, False)  # what its last decision was measured against
    workload: str | None = None  # the workload it is a share of, if any
    waiting_at: str | None = None  # the time (ISO) it began to wait: when a move is due
    moved_off: bool = False  # disabled by placement when its lost cluster's share moved away

    @property
    def per_worker(self) -> int:
        return self.per_replica // self.workers

    @property
    def previous(self) -> int:
        """Devices still held by replicas of an earlier serving configuration (a rollout)."""
        return self.allocated - self.by_digest.get(self.digest, 0)

    @property
    def wanted(self) -> int:
        """Its own footprint, plus what a previous generation holds while it rolls out."""
        if not self.enabled or self.deleted:
            return 0
        return self.desired * self.per_replica + self.previous

    @property
    def held(self) -> int:
        return max(self.granted, self.allocated)

    @property
    def claim(self) -> int:
        """What placement counts as taken: what it holds or, if managed, wants."""
        return max(self.held, self.wanted) if self.managed else self.held


@dataclass(slots=True)
class Planned:
    """A workload as placement sees it."""

    project: str
    device_class: str
    per_replica: int
    replicas: int
    digest: str
    pinned: bool
    workers: int
    allowed: tuple[str, ...] | None
    deployments: dict[str, str] = field(default_factory=dict)  # cluster -> deployment id
    deferred: bool = False  # placement found nowhere to go and said so
    preferences: Preferences = field(default_factory=Preferences)

    @property
    def per_worker(self) -> int:
        return self.per_replica // self.workers


@dataclass(frozen=True, slots=True)
class Placement:
    workload_id: str
    replicas: int
    serving_digest: str
    shares: dict[str, int]  # the clusters whose share changes, and to what
    previous: dict[str, int]  # their shares before, where the workload was on them
    message: str | None = None  # no shares: why
    reason: str | None = None  # no shares: why, as a PlacementReason
    move: Move | None = None  # the shares change as a move
    disable: str | None = None  # the cluster whose deployment is disabled with it (lost)
    enable: str | None = None  # the cluster whose (disabled) deployment takes replicas again


CAPACITY, QUOTA = AdmissionReason.INSUFFICIENT_CAPACITY, AdmissionReason.INSUFFICIENT_QUOTA


@dataclass(frozen=True, slots=True)
class Decision:
    deployment_id: str
    admitted: bool
    devices: int
    reason: str | None
    evidence: dict[str, int]
    phase: str  # admitted, pending, or the placed/running phase a growing deployment keeps
    blocker: str | None = None  # the older deployment it waits behind, if it does


class Standing(NamedTuple):
    """Where a deployment stood before a decision: enough to make it again from there."""

    phase: str
    reason: str | None
    granted: int
    rolling: bool


@dataclass
class Ledger:
    position: int = 0
    quota: dict[Key, int] = field(default_factory=dict)
    total: dict[Key, int] = field(default_factory=dict)
    classes: dict[str, set[str]] = field(default_factory=dict)  # cluster -> classes reported
    held_in_cluster: dict[Key, int] = field(default_factory=dict)
    held_by_project: dict[Key, int] = field(default_factory=dict)
    deployments: dict[str, Slot] = field(default_factory=dict)
    # live replica -> (deployment, devices, serving digest, node)
    replicas: dict[str, tuple[str, int, str, str]] = field(default_factory=dict)
    # deployment ids waiting, per (cluster, device class) and per (project, device class)
    waiting_in: dict[Key, dict[str, None]] = field(default_factory=dict)
    waiting_for: dict[Key, dict[str, None]] = field(default_factory=dict)
    # the positions the facts behind a decision were last changed at: evidence
    quota_position: dict[Key, int] = field(default_factory=dict)
    inventory_position: dict[str, int] = field(default_factory=dict)
    # per node: each (cluster, class)'s nodes (id, devices) in id order and its largest node,
    # what live replicas hold per (cluster, node), the deployments counted per (cluster, class),
    # and a count of the changes there (what placement's per-node room is cached against)
    nodes: dict[Key, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    largest: dict[Key, int] = field(default_factory=dict)
    on_node: dict[Key, int] = field(default_factory=dict)
    members: dict[Key, dict[str, None]] = field(default_factory=dict)
    in_project: dict[Key, dict[str, None]] = field(default_factory=dict)  # the same per project
    changes: dict[Key, int] = field(default_factory=dict)
    short_in: dict[Key, set[str]] = field(default_factory=dict)  # last refused for the nodes
    node_room: dict[Key, tuple[int, list[int]]] = field(default_factory=dict)
    # the pods each member may still start (what it claims, what it holds: size -> count),
    # and their sums per (cluster, class): what per-node room packs, kept as members change.
    # Counted only on the (cluster, class)es whose room per node was once asked for: where
    # no pod is wider than a device, or there is one node, the sums decide and nothing is.
    counting: set[Key] = field(default_factory=set)
    pods_of: dict[str, tuple[dict[int, int], dict[int, int]]] = field(default_factory=dict)
    unstarted: dict[tuple[Key, bool], dict[int, int]] = field(default_factory=dict)
    # placement: what every deployment holds or wants per (cluster, class), the candidates by
    # room, the workloads, and those to place (again)
    claimed: dict[Key, int] = field(default_factory=dict)
    reachable: dict[str, bool] = field(default_factory=dict)
    operated: set[str] = field(default_factory=set)  # clusters an operator has spoken for
    room: RoomIndex = field(default_factory=RoomIndex)
    workloads: dict[str, Planned] = field(default_factory=dict)
    to_place: dict[str, None] = field(default_factory=dict)
    unplaced: dict[str, dict[str, None]] = field(default_factory=dict)  # class -> workloads
    # moves: clusters' labels, since when each unreachable one is (ISO), the workloads with
    # preferences, and the time of the event being folded
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    unreachable_at: dict[str, str | None] = field(default_factory=dict)
    preferring: dict[str, None] = field(default_factory=dict)
    at: str | None = None

    # -- folding events ------------------------------------------------------------------

    def folds(self, event_type: str) -> bool:
        """Whether events of this type matter to admission."""
        return event_type in FOLDS

    def apply(self, position: int, event_type: str, aggregate_id: str, e: E) -> list[str]:
        """Fold one event; returns the deployments to decide for, in the order to decide.
        An event at or below the position reached changes nothing."""
        if position <= self.position:
            return []
        self.position = position
        self.at = e.get("timestamp")
        fold = FOLDS.get(event_type)
        return [] if fold is None else list(fold(self, aggregate_id, e))

    @handles(QuotaSet)
    def _quota_set(self, project: str, e: E) -> list[str]:
        key = (project, e["device_class"])
        shrank = e["devices"] < self.quota.get(key, 0)
        self.quota[key] = e["devices"]
        self.quota_position[key] = self.position
        woken = self._heads(self.waiting_for, key, QUOTA)
        if shrank:  # some waiting for capacity may now never fit: no longer ahead of anyone
            woken += self._behind_the_unfit(self.waiting_for, key, CAPACITY)
        over = shrank and self.held_by_project.get(key, 0) > e["devices"]
        woken += self._to_report(self.in_project.get(key, {}), over)
        return self.oldest_first(woken)

    def _to_report(self, deployment_ids: Iterable[str], over: bool) -> list[str]:
        """When a quota or a cluster's devices change, those granted in part say so again, and,
        when it shrank below what is held (`over`), so does everything that holds devices:
        what no longer fits is reported (it keeps running)."""
        return [
            deployment_id
            for deployment_id in deployment_ids
            if (slot := self.deployments[deployment_id]).managed
            and slot.phase in HOLDS
            and ((over and slot.held) or slot.reason in PARTIAL)
        ]

    @handles(ClusterRegistered)
    def _cluster_registered(self, cluster: str, e: E) -> list[str]:
        self.reachable[cluster] = True
        labels = dict(e.get("labels") or {})
        if labels != self.labels.get(cluster):  # they may match a selector that none did
            self._place_again(self.classes.get(cluster, ()))
        self.labels[cluster] = labels
        return []

    def reachability(self) -> dict[str, bool]:
        """Every known cluster, and whether it is reachable now: one whose operator has
        never spoken is watched too, so that its silence is noticed."""
        return dict(self.reachable)

    @handles(OperatorConnected)
    def _operator_connected(self, cluster: str, e: E) -> list[str]:
        """A cluster becomes a placement candidate once an operator speaks for it: before
        that, nothing placed there could run."""
        if cluster not in self.operated:
            self.operated.add(cluster)
            self._reach(cluster, self.reachable.get(cluster, True))
        return []

    @handles(ClusterUnreachable)
    def _cluster_unreachable(self, cluster: str, e: E) -> list[str]:
        self.unreachable_at.setdefault(cluster, self.at)
        return self._reach(cluster, False)

    @handles(ClusterReachable)
    def _cluster_reachable(self, cluster: str, e: E) -> list[str]:
        self.unreachable_at.pop(cluster, None)
        return self._reach(cluster, True)

    @handles(InventoryReported)
    def _inventory_reported(self, cluster: str, e: E) -> list[str]:
        """A cluster's capacity is what its nodes can take: an unschedulable node nothing,
        the others their devices less those held outside Wingsmith. Pod sizes follow the
        largest node's devices, whatever holds them, so that the render does not flap."""
        totals: dict[str, int] = {}
        nodes: dict[str, list[tuple[str, int]]] = {}
        largest: dict[str, int] = {}
        for node in e["nodes"]:
            device_class, devices = node["device_class"], node["devices"]
            usable = 0 if node.get("unschedulable") else devices - node.get("held_outside", 0)
            totals[device_class] = totals.get(device_class, 0) + usable
            nodes.setdefault(device_class, []).append((node["node_id"], usable))
            largest[device_class] = max(largest.get(device_class, 0), devices)
        classes = self.classes.get(cluster, set()) | totals.keys()
        self.classes[cluster] = set(totals)
        woken: list[str] = []
        for device_class in classes:
            key = (cluster, device_class)
            before = self.total.get(key, 0)
            shrank = totals.get(device_class, 0) < before
            self.total[key] = totals.get(device_class, 0)
            reshaped = self._set_nodes(
                key, sorted(nodes.get(device_class, ())), largest.get(device_class, 0)
            )
            self._refresh_room(cluster, device_class)
            woken += self._heads(self.waiting_in, key, CAPACITY)
            if shrank or reshaped:  # some waiting for quota may now never fit: no longer
                woken += self._behind_the_unfit(self.waiting_in, key, QUOTA)  # ahead of anyone
            if self.total[key] != before:
                woken += self._to_report(self.members.get(key, {}), shrank)  # per node too
        self.inventory_position[cluster] = self.position
        self._place_again(totals)
        return self.oldest_first(woken)

    def _set_nodes(self, key: Key, nodes: list[tuple[str, int]], largest: int) -> bool:
        """A device class's nodes on a cluster (id, usable devices) and its largest node's
        devices; whether they changed."""
        if tuple(nodes) == self.nodes.get(key, ()) and largest == self.largest.get(key, 0):
            return False
        resized = largest != self.largest.get(key, 0)
        if nodes:
            self.nodes[key] = tuple(nodes)
            self.largest[key] = largest
        else:
            self.nodes.pop(key, None)
            self.largest.pop(key, None)
        if resized:  # pod sizes follow the largest node
            for deployment_id in self.members.get(key, ()):
                self._count_pods(deployment_id, self.deployments[deployment_id])
        self._changed(key)
        return True

    @handles(WorkloadCreated)
    def _workload_created(self, workload_id: str, e: E) -> list[str]:
        allowed = e.get("allowed_clusters")
        preferences = Preferences.model_validate(e.get("preferences") or {})
        if preferences.given:
            self.preferring[workload_id] = None
        self.workloads[workload_id] = Planned(
            project=e["project"],
            device_class=e["device_class"],
            per_replica=e["serving"]["devices_per_replica"],
            replicas=e["replicas"],
            digest=e["serving_digest"],
            pinned=e["cluster_pin"] is not None,
            workers=workers_per_replica(e["serving"]),
            allowed=None if allowed is None else tuple(allowed),
            preferences=preferences,
        )
        self.to_place[workload_id] = None
        return []

    @handles(PlacementPreferencesChanged)
    def _preferences_changed(self, workload_id: str, e: E) -> list[str]:
        """New replicas follow them; rebalancing moves the others (`moves`)."""
        w = self.workloads[workload_id]
        w.preferences = Preferences.model_validate(e["preferences"])
        if w.preferences.given:
            self.preferring[workload_id] = None
        else:
            self.preferring.pop(workload_id, None)
        self.to_place[workload_id] = None
        return []

    @handles(WorkloadScaled)
    def _workload_scaled(self, workload_id: str, e: E) -> list[str]:
        self.workloads[workload_id].replicas = e["replicas"]
        self.to_place[workload_id] = None
        return []

    @handles(WorkloadServingConfigChanged)
    def _workload_serving_config_changed(self, workload_id: str, e: E) -> list[str]:
        w = self.workloads[workload_id]
        w.per_replica, w.digest = e["serving"]["devices_per_replica"], e["serving_digest"]
        w.workers = workers_per_replica(e["serving"])
        self.to_place[workload_id] = None  # its room is counted in replicas of the new size
        return []

    @handles(WorkloadDeleted)
    def _workload_deleted(self, workload_id: str, e: E) -> list[str]:
        """Its deployments are deleted in the same command, right after it: they go here at
        once, so that none of them is decided for on what another one's deletion released."""
        w = self.workloads.pop(workload_id)
        self.to_place.pop(workload_id, None)
        self.preferring.pop(workload_id, None)
        self.unplaced.get(w.device_class, {}).pop(workload_id, None)
        released = [d for key in w.deployments.values() for d in self._delete(key)]
        return self.oldest_first(released)

    @handles(WorkloadMoved)
    def _workload_moved(self, workload_id: str, e: E) -> list[str]:
        """What placement moved off a lost cluster whole (the move's own events fold the
        shares): its deployment, disabled next, may take replicas again by a move."""
        w = self.workloads.get(workload_id)
        slot = self.deployments.get(w.deployments.get(e["from_cluster"], "")) if w else None
        if slot is not None and e["reason"] == MoveReason.CLUSTER_LOST and not slot.desired:
            slot.moved_off = True
        return []

    @handles(DeploymentAttached)
    def _deployment_attached(self, workload_id: str, e: E) -> list[str]:
        self.workloads[workload_id].deployments[e["cluster_id"]] = e["deployment_key"]
        return []

    @handles(DeploymentCreated)
    def _deployment_created(self, deployment_id: str, e: E) -> list[str]:
        return self._add(
            deployment_id,
            Slot(
                cluster=e["cluster_id"],
                project=e["project"],
                device_class=e["device_class"],
                per_replica=e["serving"]["devices_per_replica"],
                desired=e["desired_replicas"],
                digest=e["serving_digest"],
                managed=e["authority"] == Authority.MANAGED,
                workers=workers_per_replica(e["serving"]),
                workload=e.get("workload_id"),
            ),
        )

    @handles(DeploymentScaled)
    def _deployment_scaled(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, desired=e["desired_replicas"])

    @handles(ServingConfigChanged)
    def _serving_config_changed(self, deployment_id: str, e: E) -> list[str]:
        return self._change(
            deployment_id,
            per_replica=e["serving"]["devices_per_replica"],
            workers=workers_per_replica(e["serving"]),
            digest=e["serving_digest"],
            rolling=True,
        )

    @handles(DeploymentEnabled)
    def _deployment_enabled(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, enabled=True, moved_off=False)

    @handles(DeploymentDisabled)
    def _deployment_disabled(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, enabled=False)

    @handles(AuthorityPromoted)
    def _authority_promoted(self, deployment_id: str, e: E) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None or slot.managed:
            return []
        return self._change(deployment_id, managed=True)

    @handles(DeploymentDeleted)
    def _deployment_deleted(self, deployment_id: str, e: E) -> list[str]:
        return self._delete(deployment_id)

    def _delete(self, deployment_id: str) -> list[str]:
        """It leaves the queues first, so that those behind it move up; then its grant is
        released to whoever waits for it. Deleted already (with its workload): nothing."""
        slot = self.deployments.get(deployment_id)
        if slot is None or slot.deleted:
            return []
        self._stop_waiting(deployment_id, slot)
        released = self._update(deployment_id, slot, deleted=True, granted=0)
        self._leave(deployment_id, slot)  # it reserves nothing: what its replicas hold is on nodes
        return self.oldest_first([*released, *self._heads_of(slot)])

    @handles(AdmissionDecided)
    def _admission_decided(self, deployment_id: str, e: E) -> list[str]:
        limits = limits_of(e.get("evidence") or {})
        return self._set_phase(deployment_id, e["phase"], e["reason"], e.get("devices", 0), limits)

    @handles(DeploymentPlaced)
    def _deployment_placed(self, deployment_id: str, e: E) -> list[str]:
        return self._serve(deployment_id, AdmissionPhase.PLACED)

    @handles(DeploymentRunning)
    def _deployment_running(self, deployment_id: str, e: E) -> list[str]:
        return self._serve(deployment_id, AdmissionPhase.RUNNING)

    def _serve(self, deployment_id: str, phase: str) -> list[str]:
        """The cluster moved it on: what part of it waits for (granted in part) still waits."""
        slot = self.deployments.get(deployment_id)
        reason = slot.reason if slot is not None and slot.phase in HOLDS else None
        return self._set_phase(deployment_id, phase, reason)

    @handles(DeploymentFailed)
    def _deployment_failed(self, deployment_id: str, e: E) -> list[str]:
        return self._set_phase(
            deployment_id, AdmissionPhase.FAILED, AdmissionReason.CLUSTER_FAILURE, 0
        )

    @handles(FailureCleared)
    def _failure_cleared(self, deployment_id: str, e: E) -> list[str]:
        """The cluster took what it had refused: decided again from the start."""
        released = self._set_phase(
            deployment_id, AdmissionPhase.PENDING, AdmissionReason.AWAITING_ADMISSION, 0
        )
        return [deployment_id, *released] if deployment_id in self.deployments else released

    @handles(ReplicaStarted)
    def _replica_started(self, replica_id: str, e: E) -> list[str]:
        held = self.replicas[replica_id] = (
            e["deployment_id"],
            len(e["device_ids"]),
            e["serving_digest"],
            e.get("node_id", ""),
        )
        return self._allocate(*held)

    @handles(ReplicaTerminated)
    def _replica_terminated(self, replica_id: str, e: E) -> list[str]:
        held = self.replicas.pop(replica_id, None)
        return [] if held is None else self._allocate(held[0], -held[1], held[2], held[3])

    # -- deciding ------------------------------------------------------------------------

    def decide(self, deployment_id: str) -> Decision | None:
        """What admission says of this deployment now; None when nothing would change."""
        slot = self.deployments.get(deployment_id)
        if slot is None or not slot.managed or slot.deleted:
            return None
        if (
            slot.phase == AdmissionPhase.FAILED
        ):  # waits for the plane to change it, then starts over
            if not slot.retry:
                return None
            slot.retry = False
            return self._decision(deployment_id, slot, 0, AdmissionReason.AWAITING_ADMISSION, dict)
        wanted = slot.wanted
        if not slot.enabled:
            return self._decision(
                deployment_id, slot, 0, AdmissionReason.DISABLED, lambda: {"wanted": 0}
            )
        cluster_key = (slot.cluster, slot.device_class)
        project_key = (slot.project, slot.device_class)
        capacity = self.total.get(cluster_key, 0)
        quota = self.quota.get(project_key, 0)
        others_in_cluster = self.held_in_cluster.get(cluster_key, 0) - slot.held
        others_in_project = self.held_by_project.get(project_key, 0) - slot.held
        fits = wanted <= capacity - others_in_cluster and wanted <= quota - others_in_project
        # the nodes: when the sums fit but the pods do not, or when a worker fits no node
        short = (
            self._short_on_nodes(deployment_id, slot, wanted, fits) if wanted > slot.held else {}
        )

        def evidence() -> dict[str, int]:  # built only for a decision that changes something
            seen = {
                "wanted": wanted,
                "capacity": capacity,
                "held_in_cluster": others_in_cluster,
                "quota": quota,
                "held_by_project": others_in_project,
                "position": self.position,
                "inventory_position": self.inventory_position.get(slot.cluster, 0),
                "quota_position": self.quota_position.get(project_key, 0),
            }
            if slot.previous:
                seen["previous_generation"] = slot.previous
            return seen | short

        if fits and not short:
            devices, reason = wanted, None
        elif slot.rolling and slot.granted:  # the new generation starts inside the old's grant
            devices, reason = slot.granted, WAITING_FOR_PREVIOUS
        else:  # the whole replicas that fit are granted, what it holds kept; the rest waits
            reason = QUOTA if wanted > quota - others_in_project else CAPACITY
            room = min(capacity - others_in_cluster, quota - others_in_project)
            grantable, next_short = self._grantable(deployment_id, slot, room)
            devices = max(grantable, min(slot.granted, wanted))
            short = short or next_short  # the nodes hold back a replica the sums would allow
        return self._decision(
            deployment_id,
            slot,
            devices,
            reason,
            lambda: evidence() | {"granted": devices, "waiting": max(wanted - devices, 0)},
        )

    def _grantable(self, deployment_id: str, slot: Slot, room: int) -> tuple[int, dict[str, int]]:
        """The most whole replicas that fit `room` devices and the nodes, as devices (with what
        a previous generation holds; 0 when not one does), and, when the nodes hold back a
        replica that `room` would allow, the evidence of it (what moving pods may change)."""
        fits_sums = (room - slot.previous) // slot.per_replica if slot.per_replica else 0
        most = min(slot.desired, fits_sums)
        if most <= 0:
            return 0, {}

        def short(replicas: int) -> dict[str, int]:
            grant = slot.previous + replicas * slot.per_replica
            return self._short_on_nodes(deployment_id, slot, grant, True)

        if first := short(1):
            return 0, first
        low, high = 1, most  # fits low; fewer pods fit wherever more do
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (low, middle - 1) if short(middle) else (middle, high)
        return slot.previous + low * slot.per_replica, short(low + 1) if low < most else {}

    def record(self, decision: Decision) -> list[str]:
        """Apply a decision as soon as it is made, before its event comes back: the next
        decision must see it. Folding its event later changes nothing more."""
        slot = self.deployments.get(decision.deployment_id)
        if slot is not None:
            self._short(decision.deployment_id, slot, "pods_needed" in decision.evidence)
        return self._set_phase(
            decision.deployment_id,
            decision.phase,
            decision.reason,
            decision.devices,
            limits_of(decision.evidence),
        )

    def decide_all(
        self,
        deployment_ids: Iterable[str],
        on_error: OnError | None = None,
        skip: Container[str] = (),
    ) -> list[Decision]:
        """Decide in order, recording each decision before the next: one decision per
        deployment, on the state the call leaves. A deployment that would take devices while
        an older one waits for capacity in its cluster, or for quota in its project, waits
        behind it. One that a later decision of the call concerns again (devices released
        where it waits) is decided again, and that decision replaces its earlier one, which
        released no devices (so nothing decided in between counts on it: what it took, those
        decided in between counted as taken), and comes after what it counts on. A deployment
        out of failure keeps its `awaiting_admission` decision before its next one. With
        `on_error`, a deployment whose decision raises is reported there and the others are
        decided; the decisions recorded so far are kept. Those in `skip` are left as they are
        (their decisions were refused)."""
        decisions: list[Decision | None] = []  # None: replaced by a later one
        replaceable: dict[str, tuple[int, Standing]] = {}  # where its decision is, and from
        queue = dict.fromkeys(deployment_ids)
        while queue:
            deployment_id = next(iter(queue))
            del queue[deployment_id]
            if deployment_id in skip:
                continue
            try:
                decided, released = self._decide_one(deployment_id)
            except Exception as e:
                if on_error is None:
                    raise
                on_error(deployment_id, e)
                continue
            if decided is not None:
                self._keep(*decided, decisions, replaceable)
            queue.update(dict.fromkeys(released))
        return [decision for decision in decisions if decision is not None]

    def _decide_one(self, deployment_id: str) -> tuple[tuple[Decision, Standing] | None, list[str]]:
        """A decision, recorded, with the deployment as it stood before it; and who to decide
        for after it."""
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return None, []
        decision = self.decide(deployment_id)
        if decision is None:
            if slot.phase in HOLDS and slot.wanted > slot.granted:
                self._wait(deployment_id, slot)  # to grow when there is room
            return None, []
        behind = (
            self._behind_a_blocker(slot, deployment_id) if decision.devices > slot.held else None
        )
        if behind is not None:  # its turn comes after the older one's: it keeps what it
            self._wait(deployment_id, slot)  # holds, and says what it waits for, and where
            (waits_for, place, blocker), kept = behind, min(slot.granted, slot.wanted)
            evidence = decision.evidence | {
                "granted": kept,
                "waiting": slot.wanted - kept,
                "queue_position": place,
            }
            decision = self._decision(deployment_id, slot, kept, waits_for, lambda: evidence)
            if decision is None:
                return None, []
            decision = replace(decision, blocker=blocker)
        stood = Standing(slot.phase, slot.reason, slot.granted, slot.rolling)
        released = self.record(decision)
        if decision.reason == AdmissionReason.AWAITING_ADMISSION:  # out of failure: decide again
            released = [deployment_id, *released]
        return (decision, stood), released

    def _keep(
        self,
        decision: Decision,
        stood: Standing,
        decisions: list[Decision | None],
        replaceable: dict[str, tuple[int, Standing]],
    ) -> None:
        """Add a decision to the call's, in place of the deployment's earlier one if that
        released no devices: it is then made from where the deployment stood before that one."""
        earlier = replaceable.pop(decision.deployment_id, None)
        if earlier is not None:
            index, stood = earlier
            decisions[index] = None
            once = self._made_from(stood, decision)
            if once is None:  # it stands where it stood: nothing to send
                return
            decision = once
        if decision.reason != "awaiting_admission" and decision.devices >= stood.granted:
            replaceable[decision.deployment_id] = (len(decisions), stood)
        decisions.append(decision)

    def _made_from(self, stood: Standing, decision: Decision) -> Decision | None:
        """The decision as if made once, from where the deployment stood: a serving one
        admitted keeps its phase; none if it stands there again."""
        once = self._decision(
            decision.deployment_id, stood, decision.devices, decision.reason, dict
        )
        slot = self.deployments[decision.deployment_id]
        if once is None:
            slot.phase, slot.rolling = stood.phase, stood.rolling
            return None
        slot.phase = once.phase
        return replace(decision, phase=once.phase)

    def _behind_a_blocker(self, slot: Slot, deployment_id: str) -> tuple[str, int, str] | None:
        """What an older deployment ahead of this one waits for, if one does, this one's
        place in that queue (1: its head), and the first one ahead that blocks it."""
        for queues, key, reason in (
            (self.waiting_in, (slot.cluster, slot.device_class), CAPACITY),
            (self.waiting_for, (slot.project, slot.device_class), QUOTA),
        ):
            queue = queues.get(key, {})
            if deployment_id not in queue:  # newer than all who wait there
                heads = self._heads(queues, key, reason)
                if heads and self._blocks(self.deployments[heads[-1]], reason):
                    return reason, len(queue) + 1, heads[-1]
                continue
            blocker: str | None = None
            for place, other in enumerate(queue, 1):
                if other == deployment_id:
                    if blocker is not None:
                        return reason, place, blocker
                    break
                if blocker is None and self._blocks(self.deployments[other], reason):
                    blocker = other
        return None

    def _heads(self, queues: dict[Key, dict[str, None]], key: Key, reason: str) -> list[str]:
        """Who may move when what a queue waits for grows: the deployments up to and including
        the first one that waits for it (`reason`), in order. The rest wait behind that one."""
        heads = []
        for deployment_id in queues.get(key, ()):
            heads.append(deployment_id)
            if self._blocks(self.deployments[deployment_id], reason):
                break
        return heads

    def _behind_the_unfit(
        self, queues: dict[Key, dict[str, None]], key: Key, reason: str
    ) -> list[str]:
        """When a total or a quota shrinks, those waiting here for the other resource that can
        now never fit stop holding back their other queue: its head moves."""
        woken: list[str] = []
        for deployment_id in queues.get(key, ()):
            slot = self.deployments[deployment_id]
            if slot.reason == reason and not self._blocks(slot, reason):
                other, other_key = (
                    (self.waiting_for, (slot.project, slot.device_class))
                    if reason == QUOTA
                    else (self.waiting_in, (slot.cluster, slot.device_class))
                )
                woken += self._heads(other, other_key, reason)
        return woken

    def _blocks(self, slot: Slot, reason: str) -> bool:
        """Waits for `reason`, and could be admitted once others release: one that wants more
        than its cluster has, or than its project's whole quota, holds back nobody."""
        return (
            slot.reason == reason
            and slot.wanted <= self.total.get((slot.cluster, slot.device_class), 0)
            and slot.wanted <= self.quota.get((slot.project, slot.device_class), 0)
            and self._could_fit_nodes(slot)
        )

    # -- bookkeeping ---------------------------------------------------------------------

    @staticmethod
    def _decision(
        deployment_id: str,
        slot: Slot | Standing,
        devices: int,
        reason: str | None,
        evidence: Callable[[], dict[str, int]],
    ) -> Decision | None:
        """Admitted when there is no reason to wait, or when part of what it wants is granted
        and the rest waits for quota or capacity; None when nothing would change. A placed or
        running deployment that is admitted again keeps its phase: only its grant moves. One
        that waits, in part or whole, for quota or capacity says so again when what it was
        measured against moved (quota, capacity, the nodes holding it back), so that what no
        longer fits is reported and what pods moving on the nodes may change is looked at."""
        admitted = reason is None or (devices > 0 and reason in PARTIAL)
        phase: str = AdmissionPhase.ADMITTED if admitted else AdmissionPhase.PENDING
        if admitted and slot.phase in HOLDS:
            phase = slot.phase
        if (phase, reason, devices) != (slot.phase, slot.reason, slot.granted):
            return Decision(deployment_id, admitted, devices, reason, evidence(), phase)
        if reason not in PARTIAL or not isinstance(slot, Slot):
            return None
        measured = evidence()
        if limits_of(measured) == slot.limits:
            return None
        return Decision(deployment_id, admitted, devices, reason, measured, phase)

    def _change(self, deployment_id: str, **fields: Any) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return []
        released = self._update(deployment_id, slot, **fields)
        slot.retry = slot.phase == AdmissionPhase.FAILED
        return [deployment_id, *released, *self._behind(slot)] if slot.managed else released

    def _behind(self, slot: Slot) -> list[str]:
        """The heads of the queues this deployment waits in: what it wants changed, so it may
        no longer hold them back."""
        waits = slot.phase == AdmissionPhase.PENDING or slot.reason in PARTIAL
        return self._heads_of(slot) if waits else []

    def _heads_of(self, slot: Slot) -> list[str]:
        """The heads of both queues a deployment waits in (or waited in)."""
        return [
            *self._heads(self.waiting_in, (slot.cluster, slot.device_class), CAPACITY),
            *self._heads(self.waiting_for, (slot.project, slot.device_class), QUOTA),
        ]

    def _set_phase(
        self,
        deployment_id: str,
        phase: str,
        reason: str | None,
        granted: int | None = None,
        limits: Limits | None = None,
    ) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return []
        fields: dict[str, Any] = {"phase": phase, "reason": reason}
        if granted is not None:
            fields["granted"] = granted
        if limits is not None:
            fields["limits"] = limits
        if reason is None or (phase in HOLDS and reason in PARTIAL):
            fields["rolling"] = False  # the new generation is admitted, in whole or in part
        was = slot.reason
        released = self._update(deployment_id, slot, **fields)
        waits = phase == AdmissionPhase.PENDING and reason != AdmissionReason.DISABLED
        if slot.managed and (waits or (phase in HOLDS and slot.wanted > slot.granted)):
            self._wait(deployment_id, slot)  # pending, or serving and waiting to grow
        else:
            self._stop_waiting(deployment_id, slot)
        if was != slot.reason and was in (CAPACITY, QUOTA):  # those behind it may move up
            queues, key = (
                (self.waiting_in, (slot.cluster, slot.device_class))
                if was == CAPACITY
                else (self.waiting_for, (slot.project, slot.device_class))
            )
            released = self.oldest_first([*released, *self._heads(queues, key, was)])
        return released

    def _allocate(self, deployment_id: str, devices: int, digest: str, node: str) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return []
        on = (slot.cluster, node)
        if held_there := self.on_node.get(on, 0) + devices:
            self.on_node[on] = held_there
        else:
            self.on_node.pop(on, None)
        by_digest = {**slot.by_digest, digest: slot.by_digest.get(digest, 0) + devices}
        released = self._update(
            deployment_id, slot, allocated=slot.allocated + devices, by_digest=by_digest
        )
        if not released:  # within its grant: not where admission counted it, perhaps
            released = self._moved_on_nodes(slot)
        if digest != slot.digest and slot.managed:  # a previous generation moved: decide again
            return [deployment_id, *released, *self._behind(slot)]
        return released

    def _moved_on_nodes(self, slot: Slot) -> list[str]:
        """A pod started or ended inside a grant: the sums stand, but which nodes are free may
        not be what admission counted. Those short of room on nodes there look again."""
        key = (slot.cluster, slot.device_class)
        if not self.short_in.get(key):
            return []
        heads = self._heads(self.waiting_in, key, CAPACITY)
        return heads if any(self.deployments[d].short_on_nodes for d in heads) else []

    def _short(self, deployment_id: str, slot: Slot, short: bool) -> None:
        """Whether a deployment was last refused because its pods did not fit the nodes."""
        key = (slot.cluster, slot.device_class)
        slot.short_on_nodes = short
        if short:
            self.short_in.setdefault(key, set()).add(deployment_id)
        elif deployment_id in self.short_in.get(key, ()):
            self.short_in[key].discard(deployment_id)
            if not self.short_in[key]:
                del self.short_in[key]

    def _add(self, deployment_id: str, slot: Slot) -> list[str]:
        self.deployments[deployment_id] = slot
        self.members.setdefault((slot.cluster, slot.device_class), {})[deployment_id] = None
        self.in_project.setdefault((slot.project, slot.device_class), {})[deployment_id] = None
        self._count_pods(deployment_id, slot)
        self._changed((slot.cluster, slot.device_class))
        self._claim(slot, slot.claim)
        if not slot.managed:  # observed: it runs already and is not admitted here
            slot.phase, slot.reason = AdmissionPhase.ADMITTED, None
            return []
        self._wait(deployment_id, slot)
        return [deployment_id]

    def _update(self, deployment_id: str, slot: Slot, **fields: Any) -> list[str]:
        """Change a slot, keep the held and claimed sums right, and return who waits for what
        it freed."""
        before, claim = slot.held, slot.claim
        for name, value in fields.items():
            setattr(slot, name, value)
        self._count_pods(deployment_id, slot)
        self._changed((slot.cluster, slot.device_class))
        self._claim(slot, slot.claim - claim)
        moved = slot.held - before
        if not moved:
            return []
        cluster_key = (slot.cluster, slot.device_class)
        project_key = (slot.project, slot.device_class)
        self.held_in_cluster[cluster_key] = self.held_in_cluster.get(cluster_key, 0) + moved
        self.held_by_project[project_key] = self.held_by_project.get(project_key, 0) + moved
        if moved > 0:
            return []
        return self.oldest_first(
            [
                *self._heads(self.waiting_in, cluster_key, CAPACITY),
                *self._heads(self.waiting_for, project_key, QUOTA),
            ]
        )

    # -- placement -----------------------------------------------------------------------

    def next_placement(self) -> Placement | None:
        """The next workload whose shares should change, oldest request first."""
        while self.to_place:
            workload_id = next(iter(self.to_place))
            del self.to_place[workload_id]
            placement = self.place(workload_id)
            if placement is not None:
                return placement
        return None

    def place(self, workload_id: str) -> Placement | None:
        """New shares for the workload (domain/placement.py), or None when they stand."""
        w = self.workloads.get(workload_id)
        if w is None or w.pinned:
            return None
        current = {c: self.deployments[d].desired for c, d in w.deployments.items()}
        fit = functools.partial(self._room_for, w)
        stopped = self._stopped(w)

        def free(cluster: str) -> int | None:
            unclaimed = self.room.free(cluster, w.device_class)
            return None if unclaimed is None or cluster in stopped else fit(cluster, unclaimed)

        if w.preferences.given:
            growth = max(w.replicas - sum(current.values()), 0)
            candidates = self.candidates(w, exclude=stopped, enough=growth)
            new = preferred_shares(
                w.replicas, w.per_replica, current, candidates, w.preferences.strategy
            )
        else:
            with contextlib.closing(self.room.most_free(w.device_class, among=w.allowed)) as most:
                open_ = ((c, f) for c, f in most if c not in stopped) if stopped else most
                new = shares(
                    w.replicas, w.per_replica, current, free, by_room(open_, fit, w.per_replica)
                )
        if new:
            previous = {c: current[c] for c in new if c in current}
            return Placement(workload_id, w.replicas, w.digest, new, previous)
        if sum(current.values()) == w.replicas:
            return None
        self.unplaced.setdefault(w.device_class, {})[workload_id] = None
        if w.deferred:
            return None
        where = "its allowed clusters" if w.allowed else "reachable clusters"
        message = f"none of {where} reports {w.device_class} devices"
        reason = PlacementReason.NO_CLUSTER_HAS_DEVICE_CLASS
        with contextlib.closing(self.room.most_free(w.device_class, among=w.allowed)) as most:
            first = next(most, None)
            if first is not None and not self._any_matches(w, itertools.chain([first], most)):
                reason = PlacementReason.NO_CLUSTER_MATCHES_SELECTOR
                labels = ", ".join(f"{k}={v}" for k, v in w.preferences.cluster_selector.items())
                message = f"none of {where} that report {w.device_class} devices has {labels}"
            elif first is not None:  # there are some: their nodes are too small
                reason = PlacementReason.NO_NODE_HOLDS_A_POD
                message = (
                    f"no {w.device_class} node of {where} holds a pod of a {w.per_worker}-device "
                    f"worker: split over at most {MAX_NODES_PER_WORKER} nodes, a pod needs "
                    f"{smallest_pod(w.per_worker)} devices"
                )
        return Placement(workload_id, w.replicas, w.digest, {}, {}, message, reason)

    def record_placement(self, placement: Placement) -> list[str]:
        """Apply placement's change once the hub has made it (its events are then skipped);
        returns the deployments admission should decide for."""
        w = self.workloads[placement.workload_id]
        w.deferred = not placement.shares
        if placement.shares:
            self.unplaced.get(w.device_class, {}).pop(placement.workload_id, None)
        decide: list[str] = []
        for cluster, share in placement.shares.items():
            deployment_id = w.deployments.get(cluster)
            if deployment_id is not None:
                decide += self._change(deployment_id, desired=share)
                continue
            deployment_id = w.deployments[cluster] = Deployment.key_for(
                placement.workload_id, cluster
            )
            slot = Slot(
                cluster=cluster,
                project=w.project,
                device_class=w.device_class,
                per_replica=w.per_replica,
                desired=share,
                digest=w.digest,
                workers=w.workers,
                workload=placement.workload_id,
            )
            decide += self._add(deployment_id, slot)
        if placement.disable is not None:  # its replicas went elsewhere: it stops
            decide += self._change(w.deployments[placement.disable], enabled=False)
            self.deployments[w.deployments[placement.disable]].moved_off = True
        if placement.enable is not None:
            decide += self._change(w.deployments[placement.enable], enabled=True, moved_off=False)
        return decide

    def undo_placement(self, placement: Placement) -> list[str]:
        """Take back a placement recorded before the hub refused it (the workload changed
        meanwhile): shares as they were, deployments it would have created gone. Returns the
        deployments admission should decide for again."""
        w = self.workloads.get(placement.workload_id)
        if w is None:
            return []
        if not placement.shares:
            w.deferred = False
        decide: list[str] = []
        for cluster, enabled in ((placement.disable, True), (placement.enable, False)):
            if cluster is not None and cluster in w.deployments:
                decide += self._change(
                    w.deployments[cluster], enabled=enabled, moved_off=not enabled
                )
        for cluster in placement.shares:
            deployment_id = w.deployments.get(cluster)
            if deployment_id is None:
                continue
            if cluster in placement.previous:
                decide += self._change(deployment_id, desired=placement.previous[cluster])
            else:
                del w.deployments[cluster]
                decide += self._forget(deployment_id)
        return decide

    def _forget(self, deployment_id: str) -> list[str]:
        """Remove a deployment that never existed: it holds nothing (nobody decided for it)."""
        slot = self.deployments.pop(deployment_id, None)
        if slot is None:
            return []
        self._stop_waiting(deployment_id, slot)
        self._leave(deployment_id, slot)
        self._claim(slot, -slot.claim)
        return [d for d in self._heads_of(slot) if d in self.deployments]

    # -- what moves see --------------------------------------------------------------------

    def candidates(self, w: Planned, exclude: Container[str], enough: int) -> list[tuple[str, int]]:
        """(cluster, room in devices) the workload may go to, most preferred first: reachable,
        allowed, matching its selector, its workers fitting the nodes. Its preferred clusters
        and those it is on are always there; of the others, read most free first, only until
        `enough` have room for a replica (as many as replicas are to be placed: no more can
        take one) or one has not, so that a large fleet is not read for each placement."""
        known: dict[str, int] = {}  # cluster -> free devices, unclaimed
        for cluster in (*w.preferences.preferred_clusters, *w.deployments):
            free = self.room.free(cluster, w.device_class)
            if free is not None and (w.allowed is None or cluster in w.allowed):
                known[cluster] = free
        found: list[tuple[str, int, int]] = []  # (cluster, room, free)
        seen: set[str] = set()
        more = 0  # read from the index, with room for a replica
        with contextlib.closing(self.room.most_free(w.device_class, among=w.allowed)) as most:
            for cluster, free in itertools.chain(known.items(), most):
                read = cluster not in known
                if read and more >= enough:
                    break
                if cluster in seen:
                    continue
                seen.add(cluster)
                if cluster in exclude or not w.preferences.matches(self.labels.get(cluster, {})):
                    continue
                counted = self._room_for(w, cluster, free)
                if counted is not None:
                    more += read and counted >= w.per_replica
                    found.append((cluster, counted, free))
                if read and free < w.per_replica:
                    break  # none after it has room for a replica either
        found.sort(key=lambda t: (-t[2], t[0]))  # most free first, as the index reads them
        return w.preferences.order([(c, r) for c, r, _ in found])

    def _any_matches(self, w: Planned, clusters: Iterable[tuple[str, int]]) -> bool:
        """Whether one of the clusters has the labels the workload's selector asks for."""
        selector = w.preferences.cluster_selector
        return not selector or any(
            w.preferences.matches(self.labels.get(c, {})) for c, _ in clusters
        )

    def room_anywhere(self, w: Planned) -> bool:
        """Whether any candidate has free devices for one replica of the workload."""
        with contextlib.closing(self.room.most_free(w.device_class, among=w.allowed)) as most:
            top = next(most, None)
        return top is not None and top[1] >= w.per_replica

    def held_off(self, w: Planned) -> set[str]:
        """The clusters where a person disabled the workload's deployment: no move goes there,
        and the workload is not rebalanced while one is."""
        return {
            c
            for c, d in w.deployments.items()
            if not (slot := self.deployments[d]).enabled and not slot.moved_off
        }

    def _stopped(self, w: Planned) -> set[str]:
        """The clusters where the workload's deployment is disabled: placement gives them
        nothing (a move may take it back, enabling it)."""
        return {c for c, d in w.deployments.items() if not self.deployments[d].enabled}

    def _reach(self, cluster: str, reachable: bool) -> list[str]:
        self.reachable[cluster] = reachable
        for device_class in self.classes.get(cluster, ()):
            self._refresh_room(cluster, device_class)
        if reachable:
            self._place_again(self.classes.get(cluster, ()))
        return []

    def _place_again(self, device_classes: Iterable[str]) -> None:
        """Workloads that found nowhere to go try again: a candidate may have appeared."""
        for device_class in device_classes:
            self.to_place.update(self.unplaced.pop(device_class, {}))

    def _claim(self, slot: Slot, devices: int) -> None:
        if devices:
            key = (slot.cluster, slot.device_class)
            self.claimed[key] = self.claimed.get(key, 0) + devices
            self._refresh_room(*key)

    def _refresh_room(self, cluster: str, device_class: str) -> None:
        key = (cluster, device_class)
        total = self.total.get(key, 0)
        candidate = total > 0 and cluster in self.operated and self.reachable.get(cluster, True)
        free = max(total - self.claimed.get(key, 0), 0) if candidate else None
        self.room.set(cluster, device_class, free)

    # -- per node ------------------------------------------------------------------------

    def _changed(self, key: Key) -> None:
        self.changes[key] = self.changes.get(key, 0) + 1

    def _leave(self, deployment_id: str, slot: Slot) -> None:
        self._short(deployment_id, slot, False)
        key = (slot.cluster, slot.device_class)
        for index, at in ((self.members, key), (self.in_project, (slot.project, key[1]))):
            members = index.get(at)
            if members is not None:
                members.pop(deployment_id, None)
                if not members:
                    del index[at]
        self._count_pods(deployment_id, slot)
        self._changed(key)

    def _pod(self, key: Key, worker: int) -> tuple[int, int] | None:
        """(nodes per worker, devices per pod) for a worker of this many devices there; None
        when no node of the class could hold a pod of it (domain/nodes.py)."""
        largest = self.largest.get(key, 0)
        if worker == 1:  # the common case, without a call
            return (1, 1) if largest >= 1 else None
        n = span(worker, largest)
        return None if n is None else (n, worker // n)

    def _free_on_nodes(self, key: Key, claims: bool, exclude: str | None = None) -> list[int]:
        """Free devices per node, in node id order: what live replicas hold there is taken,
        and so are the pods every other deployment may still start (what it holds or, with
        `claims`, what placement counts it for, less what its replicas hold), first fit,
        largest first. Pods that fit no node are left to the sums."""
        if key not in self.counting:  # asked for the first time here: count from now on
            self.counting.add(key)
            for deployment_id in self.members.get(key, ()):
                self._count_pods(deployment_id, self.deployments[deployment_id])
        cluster = key[0]
        free = [
            max(devices - self.on_node.get((cluster, node), 0), 0)
            for node, devices in self.nodes.get(key, ())
        ]
        wanted = dict(self.unstarted.get((key, claims), {}))
        own = self.pods_of.get(exclude) if exclude is not None else None
        for size, count in (own[0 if claims else 1] if own else {}).items():
            wanted[size] -= count
        pack(free, wanted)
        return free

    def _count_pods(self, deployment_id: str, slot: Slot) -> None:
        """Keep the unstarted pods of a (cluster, class) right after one of its deployments
        changed: take out what it counted for, and put in what it counts for now."""
        key = (slot.cluster, slot.device_class)
        if key not in self.counting:
            return
        counted = self.pods_of.pop(deployment_id, None)
        if counted is not None:
            self._tally(key, counted, -1)
        if deployment_id not in self.members.get(key, ()):
            return
        now = (
            self._unstarted_pods(key, slot, slot.claim),
            self._unstarted_pods(key, slot, slot.held),
        )
        if now[0] or now[1]:
            self.pods_of[deployment_id] = now
            self._tally(key, now, 1)

    def _unstarted_pods(self, key: Key, slot: Slot, devices: int) -> dict[int, int]:
        """The pods of `devices` (what it claims or holds) its replicas have not started."""
        unstarted = devices - slot.allocated
        pod = self._pod(key, slot.per_worker) if unstarted > 0 else None
        return {} if pod is None else pods(unstarted, pod[1])

    def _tally(self, key: Key, counted: tuple[dict[int, int], dict[int, int]], sign: int) -> None:
        for claims, found in zip((True, False), counted, strict=True):
            totals = self.unstarted.setdefault((key, claims), {})
            for size, count in found.items():
                if n := totals.get(size, 0) + sign * count:
                    totals[size] = n
                else:
                    del totals[size]
            if not totals:
                del self.unstarted[(key, claims)]

    def _short_on_nodes(
        self, deployment_id: str, slot: Slot, wanted: int, counted: bool
    ) -> dict[str, int]:
        """Why the pods of a grant of `wanted` would not fit the nodes (evidence), or {} when
        they fit or, unless the sums were `counted` to fit, when the sums say why already.
        One-device pods, and a class of one node, fit wherever the sums do."""
        key = (slot.cluster, slot.device_class)
        pod = self._pod(key, slot.per_worker)
        if pod is None:
            return self._fits_no_node(key, slot) if key in self.largest else {}
        n, size = pod
        if not counted or size == 1 or len(self.nodes.get(key, ())) < 2:
            return {}
        free = self._free_on_nodes(key, claims=False, exclude=deployment_id)
        needed = pods(wanted - slot.allocated, size)
        if not pack(list(free), needed):
            return {}
        return {
            "pod_devices": size,
            "nodes_per_worker": n,
            "pods_needed": sum(needed.values()),
            "pods_fitting": room(free, size),
            "nodes_fitting": sum(1 for f in free if f >= size),
            "largest_node_free": max(free, default=0),
        }

    def _fits_no_node(self, key: Key, slot: Slot) -> dict[str, int]:
        """Evidence that a worker fits no node there, split as evenly as it may be."""
        return {
            "worker_devices": slot.per_worker,
            "pod_devices": smallest_pod(slot.per_worker),
            "node_devices": self.largest.get(key, 0),
        }

    def _could_fit_nodes(self, slot: Slot) -> bool:
        """Whether the deployment's pods would fit its cluster's nodes were they all free."""
        key = (slot.cluster, slot.device_class)
        pod = self._pod(key, slot.per_worker)
        if pod is None:
            return False
        n, size = pod
        nodes = self.nodes[key]
        if size == 1 or len(nodes) < 2:
            return True
        return slot.desired * slot.workers * n <= room([d for _, d in nodes], size)

    def _room_for(self, w: Planned, cluster: str, free: int) -> int | None:
        """What placement counts as free for this workload on a cluster with `free` devices
        unclaimed: no more than whole replicas' pods fit on its nodes. None: its workers fit
        no node there, and the cluster is no candidate for it."""
        key = (cluster, w.device_class)
        pod = self._pod(key, w.per_worker)
        if pod is None:
            return None
        n, size = pod
        if size == 1 or len(self.nodes.get(key, ())) < 2:
            return free
        changes = self.changes.get(key, 0)
        cached = self.node_room.get(key)
        if cached is None or cached[0] != changes:
            cached = self.node_room[key] = (changes, self._free_on_nodes(key, claims=True))
        replicas = room(cached[1], size) // (w.workers * n)
        return min(free, replicas * w.per_replica)

    # -- queues --------------------------------------------------------------------------

    def _wait(self, deployment_id: str, slot: Slot) -> None:
        """Join both queues, keeping the place already held."""
        if deployment_id not in self.waiting_in.get((slot.cluster, slot.device_class), {}):
            slot.waiting_since, slot.waiting_at = self.position, self.at
        self.waiting_in.setdefault((slot.cluster, slot.device_class), {})[deployment_id] = None
        self.waiting_for.setdefault((slot.project, slot.device_class), {})[deployment_id] = None

    def _stop_waiting(self, deployment_id: str, slot: Slot) -> None:
        for queues, key in (
            (self.waiting_in, (slot.cluster, slot.device_class)),
            (self.waiting_for, (slot.project, slot.device_class)),
        ):
            queue = queues.get(key)
            if queue is not None:
                queue.pop(deployment_id, None)
                if not queue:
                    del queues[key]

    def oldest_first(self, deployment_ids: Iterable[str]) -> list[str]:
        """In the order they began to wait (creation order for those that never did)."""
        unique = dict.fromkeys(deployment_ids)
        return sorted(unique, key=lambda d: self.deployments[d].waiting_since)


# The ledger's folds by event type: the event class's name, the `type` events carry on the wire.
FOLDS: dict[str, LedgerFold] = {
    event.__name__: method
    for method in vars(Ledger).values()
    for event in getattr(method, "__handles__", ())
}
