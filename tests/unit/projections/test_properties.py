"""Properties of every projection over random fleet histories made by the real domain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from wingsmith.domain.admission import Ledger
from wingsmith.domain.deployment import Deployment
from wingsmith.domain.replica import Replica
from wingsmith.domain.values import is_stand_in
from wingsmith.projections.base import Fold, Projection
from wingsmith.projections.fleet import (
    PROJECTIONS,
    Allocations,
    Capacity,
    Clusters,
    DeploymentHealth,
    NodeCapacity,
    QuotaUse,
    WorkloadPhase,
    Workloads,
)
from wingsmith.projections.render import Render

from .history import Fleet, histories

settings.register_profile("projections", max_examples=80, deadline=None)
settings.load_profile("projections")


def fold(cls: type[Projection], envelopes: list[dict[str, Any]]) -> Projection:
    projection = cls()
    target = Fold([projection])
    for e in envelopes:
        target.apply_envelope(e)
    return projection


@given(histories(), st.data())
def test_rebuild_from_zero_equals_incremental_with_checkpoints(fleet: Fleet, data: Any) -> None:
    events = fleet.envelopes
    for cls in PROJECTIONS:
        cut = data.draw(st.integers(0, len(events)), label=f"{cls.name} checkpoint")
        first = fold(cls, events[:cut])
        resumed = cls()  # restored from a serialised checkpoint, then fed the rest
        resumed.restore(orjson.loads(orjson.dumps(first.state())))
        target = Fold([resumed], position=cut)
        for e in events[cut:]:
            target.apply_envelope(e)
        assert resumed.views == fold(cls, events).views, cls.name


@given(histories(), st.data())
def test_delivering_events_twice_changes_nothing(fleet: Fleet, data: Any) -> None:
    events = fleet.envelopes
    with_repeats = []
    for n, e in enumerate(events):
        with_repeats += [e, e]  # redelivered at once, as after a lost ack
        if data.draw(st.booleans()):  # and later, as after a reconnect
            with_repeats.append(events[data.draw(st.integers(0, n))])
    for cls in PROJECTIONS:
        assert fold(cls, with_repeats).views == fold(cls, events).views, cls.name


NONE = {"allocated": 0, "reserved": 0}


def _live(fleet: Fleet) -> list[Replica]:
    return [r for r in fleet.replicas.values() if not r.terminated]


def _sums(fleet: Fleet, key_of: Callable[[Deployment], str]) -> dict[str, dict[str, int]]:
    """Per row key, what the deployments counted there hold, as admission counts it."""
    sums: dict[str, dict[str, int]] = {}
    for d in fleet.deployments.values():
        allocated = _allocated(fleet, d.key)
        row = sums.setdefault(key_of(d), {"allocated": 0, "reserved": 0})
        row["allocated"] += allocated
        row["reserved"] += max(d.granted_devices - allocated, 0)
    return sums


@given(histories())
def test_capacity_counts_what_the_nodes_can_take_and_what_deployments_hold(fleet: Fleet) -> None:
    """Recounted from the aggregates: the nodes of the latest inventory, each deployment's
    grant and its live replicas. Free is never clamped."""
    capacity = fold(Capacity, fleet.envelopes)
    held = _sums(fleet, lambda d: f"{d.cluster_id}.{d.device_class}")
    for key, row in capacity.views.items():
        cluster, dc = row["cluster_id"], row["device_class"]
        nodes = [n for n in fleet.clusters[cluster].nodes if n.device_class == dc]
        assert row["total"] == sum(n.devices for n in nodes), key
        assert row["unschedulable"] == sum(n.devices for n in nodes if n.unschedulable), key
        assert (
            row["held_outside"] == sum(n.devices - n.usable for n in nodes) - row["unschedulable"]
        )
        assert (row["allocated"], row["reserved"]) == tuple(held.get(key, NONE).values()), key
        usable = sum(n.usable for n in nodes)
        assert row["free"] == usable - row["allocated"] - row["reserved"], key
        assert row["free"] == (
            row["total"]
            - row["unschedulable"]
            - row["held_outside"]
            - row["allocated"]
            - row["reserved"]
        )


@given(histories())
def test_each_node_shows_what_it_can_take_and_what_live_replicas_hold_on_it(
    fleet: Fleet,
) -> None:
    """Every node of the latest inventory has a view, and so has a node no longer reported
    while replicas hold devices on it (none, unschedulable); the nodes add up to their row."""
    nodes = fold(NodeCapacity, fleet.envelopes).views
    on_node: dict[str, int] = {}
    for r in _live(fleet):
        d = fleet.deployments[r.deployment_id]
        key = f"{d.cluster_id}.{d.device_class}.{r.node_id}"
        on_node[key] = on_node.get(key, 0) + len(r.device_ids)
    reported = {
        f"{c.key}.{n.device_class}.{n.node_id}": n for c in fleet.clusters.values() for n in c.nodes
    }
    assert nodes.keys() == reported.keys() | {k for k, held in on_node.items() if held}
    for key, view in nodes.items():
        node = reported.get(key)
        devices, unschedulable, outside, usable = (
            (node.devices, node.unschedulable, node.held_outside, node.usable)
            if node is not None
            else (0, True, 0, 0)
        )
        allocated = on_node.get(key, 0)
        assert (view["devices"], view["unschedulable"], view["held_outside"]) == (
            devices,
            unschedulable,
            outside,
        ), key
        assert (view["allocated"], view["free"]) == (allocated, usable - allocated), key
    for key, row in fold(Capacity, fleet.envelopes).views.items():
        in_row = [n for k, n in nodes.items() if k.startswith(f"{key}.")]
        assert sum(n["allocated"] for n in in_row) == row["allocated"], key


@given(histories())
def test_quota_use_counts_what_admission_counts(fleet: Fleet) -> None:
    """Each deployment's grant, or what its live replicas hold when that is more: a grant not
    started yet is used, so what is available is what admission would still grant."""
    use = fold(QuotaUse, fleet.envelopes)
    held = _sums(fleet, lambda d: f"{d.project}.{d.device_class}")
    for dc in ("H100", "A100"):
        row = use.views[f"p.{dc}"]
        allocated, reserved = held.get(f"p.{dc}", NONE).values()
        assert (row["allocated"], row["reserved"]) == (allocated, reserved)
        assert row["used"] == allocated + reserved
        assert row["available"] == 24 - row["used"]


@given(histories())
def test_capacity_and_quota_use_count_what_the_admission_ledger_holds(fleet: Fleet) -> None:
    """The same history folded by admission (domain/admission.py): what its ledger holds per
    cluster and per project is what the views show held, allocated and reserved together."""
    ledger = Ledger()
    for e in fleet.envelopes:
        ledger.apply(e["position"], e["type"], e["aggregate_id"], e["event"])
    for key, row in fold(Capacity, fleet.envelopes).views.items():
        held = ledger.held_in_cluster.get((row["cluster_id"], row["device_class"]), 0)
        assert row["allocated"] + row["reserved"] == held, key
    for use in fold(QuotaUse, fleet.envelopes).views.values():
        held = ledger.held_by_project.get((use["project"], use["device_class"]), 0)
        assert use["used"] == held, use


@given(histories())
def test_each_live_replica_sits_in_its_nodes_latest_topology_domain(fleet: Fleet) -> None:
    """(A node lost from the inventory has none.) Stand-ins are flagged."""
    allocations = fold(Allocations, fleet.envelopes)
    live = {key: r for key, r in fleet.replicas.items() if not r.terminated}
    assert allocations.views.keys() == live.keys()
    for key, replica in live.items():
        cluster = fleet.clusters[fleet.deployments[replica.deployment_id].cluster_id]
        domains = [n.topology_domain for n in cluster.nodes if n.node_id == replica.node_id]
        assert allocations.views[key]["topology_domain"] == (domains or [None])[0]
        stand_in = any(map(is_stand_in, replica.device_ids))
        assert allocations.views[key]["stand_in"] is stand_in


def _allocated(fleet: Fleet, deployment_id: str) -> int:
    live = (r for r in fleet.replicas.values() if r.deployment_id == deployment_id)
    return sum(len(r.device_ids) for r in live if not r.terminated)


@given(histories())
def test_deleted_workloads_and_deployments_leave_no_views(fleet: Fleet) -> None:
    workloads = {k for k, w in fleet.workloads.items() if not w.deleted}
    deployments = {k for k, d in fleet.deployments.items() if not d.deleted}
    assert fold(Workloads, fleet.envelopes).views.keys() == workloads
    assert fold(WorkloadPhase, fleet.envelopes).views.keys() == workloads
    assert fold(DeploymentHealth, fleet.envelopes).views.keys() == deployments
    rendered = {v["deployment_id"] for v in fold(Render, fleet.envelopes).views.values()}
    assert rendered <= deployments


@given(histories())
def test_workload_and_cluster_views_say_what_their_aggregates_do(fleet: Fleet) -> None:
    views = fold(Workloads, fleet.envelopes).views
    for key, view in views.items():
        w = fleet.workloads[key]
        assert (view["replicas"], view["serving_digest"], view["unplaced"]) == (
            w.replicas,
            w.serving_digest,
            w.unplaced,
        )
        assert view["deployments"] == w.deployments
    for key, view in fold(Clusters, fleet.envelopes).views.items():
        c = fleet.clusters[key]
        operator = None if c.operator is None else c.operator.model_dump(mode="json")
        assert (view["reachable"], view["operator"]) == (c.reachable, operator)
        assert (view["nodes"], view["devices"]) == (len(c.nodes), c.devices())
