"""Admission: which deployments may take devices, decided one event at a time (pure).

The ledger is a fold of the events that matter to admission — quotas, inventories, deployments
and the devices their replicas hold — and it decides for one deployment at a time. Because the
one process that runs it applies its own decisions before it decides again, two deployments can
never both be given the last free devices.

What a deployment holds: once admitted, the devices its admission granted (`desired_replicas` times
devices per replica), or what its replicas really hold when that is more; a deployment that is
not admitted (pending, failed, observed) holds what its replicas hold. Admission grants a
deployment its wanted devices only when, with everything the others hold, neither the cluster's
devices of that class nor the project's quota for it would be exceeded.

Order: deployments wait per cluster and device class, oldest first. One waiting for cluster
capacity keeps its place ahead of later ones (a large deployment is not starved by small ones);
one waiting for its project's quota does not hold back other projects. A deployment is looked at
again when something it waits for changes: the cluster's inventory, its project's quota, or
devices released in its cluster or project.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HOLDS = frozenset({"admitted", "placed", "running"})

Key = tuple[str, str]  # (cluster or project, device class)
E = Mapping[str, Any]


@dataclass(slots=True)
class Slot:
    """A deployment as admission sees it."""

    cluster: str
    project: str
    device_class: str
    per_replica: int
    desired: int
    enabled: bool = True
    managed: bool = True
    phase: str = "pending"
    reason: str | None = "awaiting_admission"
    granted: int = 0  # devices its admission granted
    allocated: int = 0  # devices its live replicas hold
    waiting_since: int = 0  # the position it began to wait at: its place in the queues
    retry: bool = False  # failed, then changed by the plane: admission starts over

    @property
    def wanted(self) -> int:
        return self.desired * self.per_replica if self.enabled else 0

    @property
    def held(self) -> int:
        return max(self.granted, self.allocated) if self.phase in HOLDS else self.allocated


def _blocks_cluster(slot: Slot) -> bool:
    """Waiting for cluster capacity: later deployments in its cluster wait behind it."""
    return slot.phase == "pending" and slot.reason == "insufficient_capacity"


@dataclass(frozen=True, slots=True)
class Decision:
    deployment_id: str
    admitted: bool
    devices: int
    reason: str | None
    evidence: dict[str, int]
    phase: str  # admitted, pending, or the placed/running phase a growing deployment keeps


@dataclass
class Ledger:
    position: int = 0
    quota: dict[Key, int] = field(default_factory=dict)
    total: dict[Key, int] = field(default_factory=dict)
    classes: dict[str, set[str]] = field(default_factory=dict)  # cluster -> classes reported
    held_in_cluster: dict[Key, int] = field(default_factory=dict)
    held_by_project: dict[Key, int] = field(default_factory=dict)
    deployments: dict[str, Slot] = field(default_factory=dict)
    replicas: dict[str, tuple[str, int]] = field(default_factory=dict)
    # deployment ids waiting, per (cluster, device class) and per (project, device class)
    waiting_in: dict[Key, dict[str, None]] = field(default_factory=dict)
    waiting_for: dict[Key, dict[str, None]] = field(default_factory=dict)
    # the positions the facts behind a decision were last changed at: evidence
    quota_position: dict[Key, int] = field(default_factory=dict)
    inventory_position: dict[str, int] = field(default_factory=dict)

    # -- folding events ------------------------------------------------------------------

    def folds(self, event_type: str) -> bool:
        """Whether events of this type matter to admission."""
        return hasattr(self, f"_on_{event_type}")

    def apply(self, position: int, event_type: str, aggregate_id: str, e: E) -> list[str]:
        """Fold one event; returns the deployments to decide for, in the order to decide.
        An event at or below the position reached changes nothing."""
        if position <= self.position:
            return []
        self.position = position
        fold = getattr(self, f"_on_{event_type}", None)
        return [] if fold is None else list(fold(aggregate_id, e))

    def _on_QuotaSet(self, project: str, e: E) -> list[str]:
        key = (project, e["device_class"])
        self.quota[key] = e["devices"]
        self.quota_position[key] = self.position
        return self.oldest_first(self.waiting_for.get(key, ()))

    def _on_InventoryReported(self, cluster: str, e: E) -> list[str]:
        totals: dict[str, int] = {}
        for node in e["nodes"]:
            totals[node["device_class"]] = totals.get(node["device_class"], 0) + node["devices"]
        classes = self.classes.get(cluster, set()) | totals.keys()
        self.classes[cluster] = set(totals)
        for device_class in classes:
            self.total[(cluster, device_class)] = totals.get(device_class, 0)
        self.inventory_position[cluster] = self.position
        return self.oldest_first(d for k in classes for d in self.waiting_in.get((cluster, k), ()))

    def _on_DeploymentCreated(self, deployment_id: str, e: E) -> list[str]:
        slot = Slot(
            cluster=e["cluster_id"],
            project=e["project"],
            device_class=e["device_class"],
            per_replica=e["serving"]["devices_per_replica"],
            desired=e["desired_replicas"],
            managed=e["authority"] == "managed",
        )
        self.deployments[deployment_id] = slot
        if not slot.managed:  # observed: it runs already and is not admitted here
            slot.reason = None
            return []
        self._wait(deployment_id, slot)
        return [deployment_id]

    def _on_DeploymentScaled(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, desired=e["desired_replicas"])

    def _on_ServingConfigChanged(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, per_replica=e["serving"]["devices_per_replica"])

    def _on_DeploymentEnabled(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, enabled=True)

    def _on_DeploymentDisabled(self, deployment_id: str, e: E) -> list[str]:
        return self._change(deployment_id, enabled=False)

    def _on_AuthorityPromoted(self, deployment_id: str, e: E) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None or slot.managed:
            return []
        return self._change(deployment_id, managed=True)

    def _on_AdmissionDecided(self, deployment_id: str, e: E) -> list[str]:
        return self._set_phase(deployment_id, e["phase"], e["reason"], e.get("devices", 0))

    def _on_DeploymentPlaced(self, deployment_id: str, e: E) -> list[str]:
        return self._set_phase(deployment_id, "placed", None)

    def _on_DeploymentRunning(self, deployment_id: str, e: E) -> list[str]:
        return self._set_phase(deployment_id, "running", None)

    def _on_DeploymentFailed(self, deployment_id: str, e: E) -> list[str]:
        return self._set_phase(deployment_id, "failed", "cluster_failure", 0)

    def _on_ReplicaStarted(self, replica_id: str, e: E) -> list[str]:
        devices = len(e["device_ids"])
        self.replicas[replica_id] = (e["deployment_id"], devices)
        return self._allocate(e["deployment_id"], devices)

    def _on_ReplicaTerminated(self, replica_id: str, e: E) -> list[str]:
        held = self.replicas.pop(replica_id, None)
        return [] if held is None else self._allocate(held[0], -held[1])

    # -- deciding ------------------------------------------------------------------------

    def decide(self, deployment_id: str) -> Decision | None:
        """What admission says of this deployment now; None when nothing would change."""
        slot = self.deployments.get(deployment_id)
        if slot is None or not slot.managed:
            return None
        if slot.phase == "failed":  # waits for the plane to change it, then starts over
            if not slot.retry:
                return None
            slot.retry = False
            return self._decision(deployment_id, slot, 0, "awaiting_admission", {})
        wanted = slot.wanted
        if not slot.enabled:
            return self._decision(deployment_id, slot, 0, "disabled", {"wanted": 0})
        cluster_key = (slot.cluster, slot.device_class)
        project_key = (slot.project, slot.device_class)
        capacity = self.total.get(cluster_key, 0)
        quota = self.quota.get(project_key, 0)
        others_in_cluster = self.held_in_cluster.get(cluster_key, 0) - slot.held
        others_in_project = self.held_by_project.get(project_key, 0) - slot.held
        evidence = {
            "wanted": wanted,
            "capacity": capacity,
            "held_in_cluster": others_in_cluster,
            "quota": quota,
            "held_by_project": others_in_project,
            "position": self.position,
            "inventory_position": self.inventory_position.get(slot.cluster, 0),
            "quota_position": self.quota_position.get(project_key, 0),
        }
        if wanted <= capacity - others_in_cluster and wanted <= quota - others_in_project:
            return self._decision(deployment_id, slot, wanted, None, evidence)
        if slot.phase in HOLDS:  # it serves: growing waits, what it holds stays
            return None
        short_of_quota = wanted > quota - others_in_project
        reason = "insufficient_quota" if short_of_quota else "insufficient_capacity"
        return self._decision(deployment_id, slot, 0, reason, evidence)

    def record(self, decision: Decision) -> list[str]:
        """Apply a decision as soon as it is made, before its event comes back: the next
        decision must see it. Folding its event later changes nothing more."""
        return self._set_phase(
            decision.deployment_id, decision.phase, decision.reason, decision.devices
        )

    def decide_all(self, deployment_ids: list[str]) -> list[Decision]:
        """Decide in order, recording each decision before the next. A deployment that would
        take devices while an older one waits for capacity in its cluster waits behind it."""
        decisions: list[Decision] = []
        queue = list(dict.fromkeys(deployment_ids))
        while queue:
            deployment_id = queue.pop(0)
            slot = self.deployments.get(deployment_id)
            if slot is None:
                continue
            decision = self.decide(deployment_id)
            takes = decision is not None and decision.devices > slot.held
            if decision is not None and not (takes and self._behind_a_blocker(deployment_id)):
                decisions.append(decision)
                released = self.record(decision)
                if decision.reason == "awaiting_admission":  # out of failure: decide again
                    released = [deployment_id, *released]
                queue += [d for d in released if d not in queue]
            elif slot.phase in HOLDS and slot.wanted > slot.granted:
                self._wait(deployment_id, slot)  # to grow when there is room
        return decisions

    def _behind_a_blocker(self, deployment_id: str) -> bool:
        slot = self.deployments[deployment_id]
        for other in self.waiting_in.get((slot.cluster, slot.device_class), ()):
            if other == deployment_id:
                return False
            if _blocks_cluster(self.deployments[other]):
                return True
        return False

    # -- bookkeeping ---------------------------------------------------------------------

    @staticmethod
    def _decision(
        deployment_id: str, slot: Slot, devices: int, reason: str | None, evidence: dict[str, int]
    ) -> Decision | None:
        """Admitted when there is no reason to wait; None when nothing would change. A placed
        or running deployment that is admitted again keeps its phase: only its grant moves."""
        admitted = reason is None
        phase = "admitted" if admitted else "pending"
        if admitted and slot.phase in HOLDS:
            phase = slot.phase
        if (phase, reason, devices) == (slot.phase, slot.reason, slot.granted):
            return None
        return Decision(deployment_id, admitted, devices, reason, evidence, phase)

    def _change(self, deployment_id: str, **fields: Any) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return []
        released = self._update(deployment_id, slot, **fields)
        slot.retry = slot.phase == "failed"
        return [deployment_id, *released] if slot.managed else released

    def _set_phase(
        self, deployment_id: str, phase: str, reason: str | None, granted: int | None = None
    ) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return []
        fields: dict[str, Any] = {"phase": phase, "reason": reason}
        if granted is not None:
            fields["granted"] = granted
        was_blocking = _blocks_cluster(slot)
        released = self._update(deployment_id, slot, **fields)
        if slot.managed and (phase == "pending" or (phase in HOLDS and slot.wanted > slot.granted)):
            self._wait(deployment_id, slot)  # pending, or serving and waiting to grow
        else:
            self._stop_waiting(deployment_id, slot)
        if was_blocking and not _blocks_cluster(slot):  # those behind it may move up
            queue = self.waiting_in.get((slot.cluster, slot.device_class), {})
            released = self.oldest_first([*released, *queue])
        return released

    def _allocate(self, deployment_id: str, devices: int) -> list[str]:
        slot = self.deployments.get(deployment_id)
        if slot is None:
            return []
        return self._update(deployment_id, slot, allocated=slot.allocated + devices)

    def _update(self, deployment_id: str, slot: Slot, **fields: Any) -> list[str]:
        """Change a slot, keep the held sums right, and return who waits for what it freed."""
        before = slot.held
        for name, value in fields.items():
            setattr(slot, name, value)
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
            [*self.waiting_in.get(cluster_key, ()), *self.waiting_for.get(project_key, ())]
        )

    def _wait(self, deployment_id: str, slot: Slot) -> None:
        """Join both queues, keeping the place already held."""
        if deployment_id not in self.waiting_in.get((slot.cluster, slot.device_class), {}):
            slot.waiting_since = self.position
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
