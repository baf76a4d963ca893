"""Hand-computed answers of each projection for small histories."""

from __future__ import annotations

from wingsmith.projections.base import Fold
from wingsmith.projections.fleet import (
    PROJECTIONS,
    Allocations,
    Capacity,
    DeploymentHealth,
    Discovered,
    QuotaUse,
    WorkloadPhase,
    workload_phase,
)

from .history import PLANE, Fleet, serving
from .test_properties import fold


def test_workload_phase_rule() -> None:
    assert workload_phase(["running", "running"]) == "running"
    assert workload_phase(["running", "failed", "pending"]) == "failed"
    assert workload_phase(["running", "placed", "admitted"]) == "admitted"
    assert workload_phase([]) == "pending"


def fleet_with_one_deployment() -> Fleet:
    fleet = Fleet()  # east and west: 16 H100 and 16 A100 each; project p: 24 of each
    fleet.run(("create", 1, "east", "H100", 2, 4))  # w1--east: 2 replicas x 4 H100
    return fleet


def test_an_admitted_deployment_reserves_then_allocates() -> None:
    fleet = fleet_with_one_deployment()
    row = lambda: fold(Capacity, fleet.envelopes).views["east.H100"]  # noqa: E731
    assert row() == {
        "cluster_id": "east",
        "device_class": "H100",
        "total": 16,
        "unschedulable": 0,
        "held_outside": 0,
        "allocated": 0,
        "reserved": 0,
        "free": 16,
    }
    fleet.run(("admit", 0, True))
    assert (row()["reserved"], row()["free"]) == (8, 8)
    fleet.run(("place", 0))
    fleet.run(("start", 0))
    assert (row()["allocated"], row()["reserved"], row()["free"]) == (4, 4, 8)
    fleet.run(("scale", 0, 3))  # wanting more reserves nothing until admission grants it
    assert (row()["allocated"], row()["reserved"], row()["free"]) == (4, 4, 8)
    fleet.run(("admit", 0, True))
    assert (row()["allocated"], row()["reserved"], row()["free"]) == (4, 8, 4)
    fleet.run(("terminate", 0))
    assert (row()["allocated"], row()["reserved"], row()["free"]) == (0, 12, 4)
    fleet.run(("fail", 0))  # a failure releases the grant
    assert (row()["allocated"], row()["reserved"], row()["free"]) == (0, 0, 16)


def test_quota_use_follows_live_allocations() -> None:
    fleet = fleet_with_one_deployment()
    fleet.run(("admit", 0, True))
    fleet.run(("start", 0))
    fleet.run(("start", 0))
    assert fold(QuotaUse, fleet.envelopes).views["p.H100"] == {
        "project": "p",
        "device_class": "H100",
        "quota": 24,
        "used": 8,
        "allocated": 8,
        "reserved": 0,
        "available": 16,
    }


def test_workload_and_deployment_views_follow_the_cluster() -> None:
    fleet = fleet_with_one_deployment()
    health = fold(DeploymentHealth, fleet.envelopes).views["w1--east"]
    assert (health["status"], health["ready_replicas"], health["degraded"]) == (None, 0, True)
    fleet.run(("admit", 0, True))
    fleet.run(("place", 0))
    fleet.run(("start", 0))
    fleet.run(("ready", 0, True))
    phases = fold(WorkloadPhase, fleet.envelopes).views["w1"]
    assert phases == {
        "workload_id": "w1",
        "name": "w1",
        "incarnation": 1,
        "phase": "running",
        "deployments": {"w1--east": "running"},
    }
    health = fold(DeploymentHealth, fleet.envelopes).views["w1--east"]
    assert (health["ready_replicas"], health["desired_replicas"], health["degraded"]) == (
        1,
        2,
        True,
    )
    fleet.run(("create", 2, "west", "A100", 1, 1))
    assert fold(WorkloadPhase, fleet.envelopes).views["w1"]["phase"] == "running"
    assert fold(WorkloadPhase, fleet.envelopes).views["w2"]["phase"] == "pending"


def test_ready_replicas_are_whole_ones_as_the_cluster_counts_them() -> None:
    fleet = fleet_with_one_deployment()  # 2 replicas wanted
    fleet.run(("admit", 0, True))
    for _ in range(3):  # a prefill, a decode and another prefill pod, all ready
        fleet.run(("start", 0))
    for pod in range(3):
        fleet.run(("ready", pod, True))
    health = lambda: fold(DeploymentHealth, fleet.envelopes).views["w1--east"]  # noqa: E731
    assert (health()["ready_replicas"], health()["degraded"]) == (3, False)  # pods, until...
    fleet.run(("status", 0, 1))  # ...the cluster says: one whole pair
    assert (health()["ready_replicas"], health()["degraded"]) == (1, True)
    fleet.run(("ready", 2, False))  # a pod's readiness no longer overrides the status
    assert health()["ready_replicas"] == 1
    fleet.run(("status", 0, 2))
    assert (health()["ready_replicas"], health()["degraded"]) == (2, False)


def test_ignored_discoveries_leave_the_default_list() -> None:
    sighting = {
        "namespace": "ns",
        "name": "qwen",
        "api_version": "nvidia.com/v1beta1",
        "backend": "vllm",
        "components": [],
    }
    events = [
        {
            "position": 1,
            "aggregate": "discovery",
            "aggregate_id": "east--ns--qwen",
            "type": "DiscoverySighted",
            "event": {"cluster_id": "east", "sighting": sighting},
        },
        {
            "position": 2,
            "aggregate": "discovery",
            "aggregate_id": "east--ns--old",
            "type": "DiscoverySighted",
            "event": {"cluster_id": "east", "sighting": sighting | {"name": "old"}},
        },
        {
            "position": 3,
            "aggregate": "discovery",
            "aggregate_id": "east--ns--old",
            "type": "DiscoveryIgnored",
            "event": {},
        },
    ]
    discovered = fold(Discovered, events)
    assert isinstance(discovered, Discovered)
    assert [v["name"] for v in discovered.listed()] == ["qwen"]
    assert len(discovered.listed(include_ignored=True)) == 2


def test_deleting_removes_the_views_and_releases_the_grant_but_not_what_replicas_hold() -> None:
    fleet = fleet_with_one_deployment()
    fleet.run(("admit", 0, True))  # 8 granted
    fleet.run(("start", 0))  # one replica holds 4 of them
    fleet.run(("delete", 0))
    capacity = fold(Capacity, fleet.envelopes).views["east.H100"]
    assert (capacity["allocated"], capacity["reserved"], capacity["free"]) == (4, 0, 12)
    assert fold(QuotaUse, fleet.envelopes).views["p.H100"]["used"] == 4
    assert list(fold(Allocations, fleet.envelopes).views) == ["w1--east--pod-0"]
    assert fold(WorkloadPhase, fleet.envelopes).views == {}
    assert fold(DeploymentHealth, fleet.envelopes).views == {}
    fleet.run(("terminate", 0))  # the cluster takes its pod down
    capacity = fold(Capacity, fleet.envelopes).views["east.H100"]
    assert (capacity["allocated"], capacity["reserved"], capacity["free"]) == (0, 0, 16)
    assert fold(QuotaUse, fleet.envelopes).views["p.H100"]["used"] == 0
    assert fold(Allocations, fleet.envelopes).views == {}


def test_a_deletion_publishes_the_removal_of_each_view() -> None:
    fleet = fleet_with_one_deployment()
    fleet.run(("admit", 0, True))
    before = len(fleet.envelopes)
    fleet.run(("delete", 0))
    target = Fold(kind() for kind in PROJECTIONS)
    for e in fleet.envelopes[:before]:
        target.apply_envelope(e)
    removed = sorted(
        (p.name, key)
        for e in fleet.envelopes[before:]
        for p, key in target.apply_envelope(e)
        if p.view(key) is None
    )
    assert removed == [
        ("deployment_health", "w1--east"),
        ("render", "east.w1--east"),
        ("workload_phase", "w1"),
        ("workloads", "w1"),
    ]


def test_an_allocation_says_which_pod_runs_what_and_whether_it_is_ready() -> None:
    fleet = fleet_with_one_deployment()
    fleet.run(("admit", 0, True))
    fleet.run(("start", 0))
    [replica] = fold(Allocations, fleet.envelopes).views.values()
    assert (replica["name"], replica["ready"]) == ("pod-0", False)
    assert replica["serving_digest"].startswith("svg_") and replica["engine_version"]
    fleet.run(("ready", 0, True))
    assert [v["ready"] for v in fold(Allocations, fleet.envelopes).views.values()] == [True]
    fleet.run(("ready", 0, False))
    assert [v["ready"] for v in fold(Allocations, fleet.envelopes).views.values()] == [False]


def test_a_deployment_view_counts_generations() -> None:
    fleet = fleet_with_one_deployment()
    assert fold(DeploymentHealth, fleet.envelopes).views["w1--east"]["generation"] == 1
    deployment = fleet.deployments["w1--east"]
    deployment.change_serving_config(PLANE, serving(deployment.serving.devices_per_replica * 2))
    fleet._keep(deployment)
    assert fold(DeploymentHealth, fleet.envelopes).views["w1--east"]["generation"] == 2


def test_a_deployment_whose_share_is_zero_holds_the_workload_phase_back_no_more() -> None:
    """w runs on east; west's share went to 0 when w shrank and admission left it `placed`:
    w runs. Grown onto west again, west's phase counts again; scaled to zero everywhere, all
    do."""
    fold = Fold([WorkloadPhase()])
    events = iter(range(1, 100))

    def event(event_type: str, aggregate_id: str, **body: object) -> None:
        fold.apply(next(events), event_type, aggregate_id, body)

    def phase() -> str:
        return str(fold.projections[0].views["w"]["phase"])

    event("WorkloadCreated", "w")
    for cluster in ("east", "west"):
        created = {"workload_id": "w", "desired_replicas": 1, "authority": "managed"}
        event("DeploymentCreated", f"w--{cluster}", **created)
        event("DeploymentPlaced", f"w--{cluster}")
    event("DeploymentRunning", "w--east")
    assert phase() == "placed"
    event("DeploymentScaled", "w--west", desired_replicas=0)
    assert phase() == "running"
    event("DeploymentScaled", "w--west", desired_replicas=2)
    assert phase() == "placed"
    event("DeploymentScaled", "w--west", desired_replicas=0)
    event("DeploymentScaled", "w--east", desired_replicas=0)
    assert phase() == "placed"  # nothing has a share: every deployment counts


def test_the_last_admission_decisions_evidence_stays_in_every_phase_after_it() -> None:
    fold = Fold([DeploymentHealth()])
    positions = iter(range(1, 100))
    at = "2026-12-04T10:00:00+00:00"

    def event(event_type: str, **body: object) -> dict[str, object]:
        fold.apply(next(positions), event_type, "w--east", body | {"timestamp": at})
        admission: dict[str, object] = fold.projections[0].views["w--east"]["admission"]
        return admission

    created = {
        "workload_id": "w",
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "desired_replicas": 2,
        "authority": "managed",
        "serving_digest": "d1",
        "serving": {"devices_per_replica": 1},
        "engine_args": [],
        "imported_args": None,
    }
    assert "evidence" not in event("DeploymentCreated", **created)
    evidence = {"wanted": 8, "capacity": 16, "held_in_cluster": 0, "quota": 8}
    decided = {"phase": "admitted", "reason": None, "evidence": evidence, "devices": 8}
    assert event("AdmissionDecided", **decided)["evidence"] == evidence
    assert event("DeploymentPlaced") == {"phase": "placed", "reason": None, "since": at} | {
        "evidence": evidence
    }
    assert event("DeploymentRunning")["evidence"] == evidence
    failed = event("DeploymentFailed", reason="Rejected", message="denied by webhook")
    assert (failed["phase"], failed["message"], failed["evidence"]) == (
        "failed",
        "denied by webhook",
        evidence,
    )
    assert event("FailureCleared")["evidence"] == evidence


def test_a_deployment_behind_a_blocker_keeps_its_name_while_part_of_it_waits() -> None:
    fold = Fold([DeploymentHealth()])
    positions = iter(range(1, 100))
    at = "2026-12-04T10:00:00+00:00"

    def event(event_type: str, **body: object) -> dict[str, object]:
        fold.apply(next(positions), event_type, "w--east", body | {"timestamp": at})
        view: dict[str, object] = fold.projections[0].views["w--east"]
        return view

    created = {
        "workload_id": "w",
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "desired_replicas": 2,
        "authority": "managed",
        "serving_digest": "d1",
        "serving": {"devices_per_replica": 1},
        "engine_args": [],
        "imported_args": None,
    }
    view = event("DeploymentCreated", **created)
    assert (view["project"], view["device_class"]) == ("p", "H100")
    evidence = {"wanted": 2, "granted": 1, "waiting": 1, "queue_position": 2}
    decided = {"phase": "admitted", "reason": "insufficient_quota", "evidence": evidence}
    view = event("AdmissionDecided", **decided, devices=1, blocker="big--east")
    assert view["admission"]["blocker"] == "big--east"  # type: ignore[index]
    assert event("DeploymentPlaced")["admission"]["blocker"] == "big--east"  # type: ignore[index]
