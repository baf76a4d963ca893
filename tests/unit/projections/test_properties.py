"""Properties of every projection over random fleet histories made by the real domain."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from wingsmith.projections.base import Fold, Projection
from wingsmith.projections.fleet import (
    PROJECTIONS,
    Allocations,
    Capacity,
    Clusters,
    DeploymentHealth,
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


@given(histories())
def test_allocated_devices_are_never_free(fleet: Fleet) -> None:
    capacity = fold(Capacity, fleet.envelopes)
    live: dict[str, int] = {}
    for replica in fleet.replicas.values():
        if not replica.terminated:
            d = fleet.deployments[replica.deployment_id]
            key = f"{d.cluster_id}.{d.device_class}"
            live[key] = live.get(key, 0) + len(replica.device_ids)
    for key, row in capacity.views.items():
        assert row["allocated"] == live.get(key, 0), key
        assert row["free"] == max(row["total"] - row["allocated"] - row["reserved"], 0)
        assert row["reserved"] >= 0


@given(histories())
def test_quota_use_counts_live_allocations(fleet: Fleet) -> None:
    use = fold(QuotaUse, fleet.envelopes)
    used: dict[str, int] = {}
    for replica in fleet.replicas.values():
        if not replica.terminated:
            d = fleet.deployments[replica.deployment_id]
            used[d.device_class] = used.get(d.device_class, 0) + len(replica.device_ids)
    for dc in ("H100", "A100"):
        row = use.views[f"p.{dc}"]
        assert row["used"] == used.get(dc, 0)
        assert row["available"] == 24 - row["used"]


@given(histories())
def test_each_live_replica_sits_in_its_nodes_latest_topology_domain(fleet: Fleet) -> None:
    allocations = fold(Allocations, fleet.envelopes)
    live = {key: r for key, r in fleet.replicas.items() if not r.terminated}
    assert allocations.views.keys() == live.keys()
    for key, replica in live.items():
        cluster = fleet.clusters[fleet.deployments[replica.deployment_id].cluster_id]
        [node] = [n for n in cluster.nodes if n.node_id == replica.node_id]
        assert allocations.views[key]["topology_domain"] == node.topology_domain


def _allocated(fleet: Fleet, deployment_id: str) -> int:
    live = (r for r in fleet.replicas.values() if r.deployment_id == deployment_id)
    return sum(len(r.device_ids) for r in live if not r.terminated)


@given(histories())
def test_reserved_devices_are_grants_the_replicas_do_not_hold_yet(fleet: Fleet) -> None:
    """Counted from the aggregates: a failed or deleted deployment has no grant."""
    capacity = fold(Capacity, fleet.envelopes)
    reserved: dict[str, int] = {}
    for d in fleet.deployments.values():
        key = f"{d.cluster_id}.{d.device_class}"
        unheld = max(d.granted_devices - _allocated(fleet, d.key), 0)
        reserved[key] = reserved.get(key, 0) + unheld
    for key, row in capacity.views.items():
        assert row["reserved"] == reserved.get(key, 0), key


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
