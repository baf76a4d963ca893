"""Capacity, per node and quota use on admission's basis, and stand-in devices, each rule as
given / when / then on histories made by the real domain."""

from __future__ import annotations

from typing import Any

from wingsmith.domain.admission import Ledger
from wingsmith.domain.deployment import AdmissionReason
from wingsmith.projections.fleet import Allocations, Capacity, NodeCapacity, QuotaUse

from .history import Fleet
from .test_properties import fold

# east and west: a node of 16 H100 and one of 16 A100 each (spares of 8 not reported yet);
# project p: a quota of 24 of each


def capacity(fleet: Fleet, key: str = "east.H100") -> dict[str, Any]:
    row: dict[str, Any] = fold(Capacity, fleet.envelopes).views[key]
    return row


def node(fleet: Fleet, key: str = "east.H100.east-h100") -> dict[str, Any] | None:
    view: dict[str, Any] | None = fold(NodeCapacity, fleet.envelopes).views.get(key)
    return view


def counts(row: dict[str, Any], *fields: str) -> tuple[Any, ...]:
    return tuple(row[f] for f in fields)


ROW = ("total", "unschedulable", "held_outside", "allocated", "reserved", "free")
NODE = ("devices", "unschedulable", "held_outside", "allocated", "free")


def running(replicas: int = 2, per_replica: int = 4) -> Fleet:
    """w1--east, admitted for `replicas` x `per_replica` H100, every replica started."""
    fleet = Fleet()
    fleet.run(("create", 1, "east", "H100", replicas, per_replica))
    fleet.run(("admit", 0, True))
    for _ in range(replicas):
        fleet.run(("start", 0))
    return fleet


def test_a_cordoned_node_offers_none_of_its_devices() -> None:
    fleet = Fleet()
    fleet.run(("node", "east", "H100", True, "add", 0))  # a spare of 8 joins
    assert counts(capacity(fleet), *ROW) == (24, 0, 0, 0, 0, 24)

    fleet.run(("node", "east", "H100", False, "cordon", 0))

    assert counts(capacity(fleet), *ROW) == (24, 16, 0, 0, 0, 8)
    assert counts(node(fleet) or {}, *NODE) == (16, True, 0, 0, 0)
    assert counts(node(fleet, "east.H100.east-h100-b") or {}, *NODE) == (8, False, 0, 0, 8)
    fleet.run(("node", "east", "H100", False, "uncordon", 0))
    assert capacity(fleet)["free"] == 24


def test_a_node_not_ready_is_counted_as_a_cordoned_one() -> None:
    """The operator reports both as `unschedulable` (domain/cluster.py `Node`): neither takes
    new pods, so neither's devices are free, whatever else is held on it."""
    fleet = Fleet()
    fleet.run(("node", "east", "H100", False, "outside", 4))

    fleet.run(("node", "east", "H100", False, "cordon", 0))  # NotReady, in the report

    assert counts(capacity(fleet), *ROW) == (16, 16, 0, 0, 0, 0)
    assert counts(node(fleet) or {}, *NODE) == (16, True, 4, 0, 0)


def test_devices_held_outside_wingsmith_are_not_free() -> None:
    fleet = running(replicas=1)  # 4 of the node's 16 held by a replica

    fleet.run(("node", "east", "H100", False, "outside", 6))  # a job nobody declared

    assert counts(capacity(fleet), *ROW) == (16, 0, 6, 4, 0, 6)
    assert counts(node(fleet) or {}, *NODE) == (16, False, 6, 4, 6)


def test_a_node_cordoned_under_its_replicas_shows_the_over_commitment() -> None:
    fleet = running()  # 8 held on the node, by two replicas of 4
    fleet.run(("scale", 0, 3))
    fleet.run(("admit", 0, True))  # a third replica granted, not started: 4 reserved

    fleet.run(("node", "east", "H100", False, "cordon", 0))

    assert counts(capacity(fleet), *ROW) == (16, 16, 0, 8, 4, -12)
    assert counts(node(fleet) or {}, *NODE) == (16, True, 0, 8, -8)
    fleet.run(("terminate", 0))
    fleet.run(("terminate", 1))
    assert counts(capacity(fleet), *ROW) == (16, 16, 0, 0, 12, -12)  # the grant stands
    assert counts(node(fleet) or {}, *NODE) == (16, True, 0, 0, 0)


def test_a_node_lost_under_its_replicas_stays_listed_until_they_end() -> None:
    fleet = running()
    fleet.run(("node", "east", "H100", True, "add", 0))

    fleet.run(("node", "east", "H100", False, "lose", 0))

    assert counts(capacity(fleet), *ROW) == (8, 0, 0, 8, 0, 0)
    assert counts(node(fleet) or {}, *NODE) == (0, True, 0, 8, -8)
    fleet.run(("terminate", 0))
    assert counts(node(fleet) or {}, *NODE) == (0, True, 0, 4, -4)
    fleet.run(("terminate", 1))
    assert node(fleet) is None
    fleet.run(("start", 0, True))  # on the spare: its own node counts it
    assert counts(node(fleet, "east.H100.east-h100-b") or {}, *NODE) == (8, False, 0, 4, 4)


def test_a_lost_node_leaves_no_view_when_nothing_holds_devices_on_it() -> None:
    fleet = Fleet()

    fleet.run(("node", "east", "H100", False, "lose", 0))

    assert node(fleet) is None
    assert counts(capacity(fleet), *ROW) == (0, 0, 0, 0, 0, 0)


def test_quota_use_counts_grants_not_started_yet() -> None:
    """The case of issue 16: 16 granted, 8 of them started. Counting live replicas alone said
    16 available; admission, which counts the grant, has 8 left and refuses 14."""
    fleet = Fleet()
    fleet.run(("create", 1, "east", "H100", 4, 4))
    fleet.run(("admit", 0, True))
    fleet.run(("start", 0))
    fleet.run(("start", 0))

    use = fold(QuotaUse, fleet.envelopes).views["p.H100"]

    assert counts(use, "quota", "used", "allocated", "reserved", "available") == (
        24,
        16,
        8,
        8,
        8,
    )
    fleet.run(("create", 2, "west", "H100", 1, 14))
    ledger = Ledger()
    for e in fleet.envelopes:
        ledger.apply(e["position"], e["type"], e["aggregate_id"], e["event"])
    decision = ledger.decide("w2--west")
    assert decision is not None and decision.reason == AdmissionReason.INSUFFICIENT_QUOTA


def test_a_failed_deployment_uses_only_what_its_replicas_hold() -> None:
    fleet = running(replicas=1)
    fleet.run(("scale", 0, 3))
    fleet.run(("admit", 0, True))  # 12 granted, 4 held by a live replica

    fleet.run(("fail", 0))

    use = fold(QuotaUse, fleet.envelopes).views["p.H100"]
    assert counts(use, "used", "allocated", "reserved", "available") == (4, 4, 0, 20)


def test_a_replica_on_stand_in_devices_is_flagged() -> None:
    fleet = Fleet()
    fleet.run(("create", 1, "east", "H100", 2, 2))

    fleet.run(("start", 0, False, True))  # the cluster did not name its devices
    fleet.run(("start", 0))

    views = fold(Allocations, fleet.envelopes).views
    assert views["w1--east--pod-0"]["device_ids"] == [
        "east-h100/pod-0/gpu0",
        "east-h100/pod-0/gpu1",
    ]
    assert [views[r]["stand_in"] for r in ("w1--east--pod-0", "w1--east--pod-1")] == [
        True,
        False,
    ]
