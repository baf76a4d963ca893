"""Admission and placement count per node: a worker's pods must fit whole nodes, not only the
cluster's sum of devices (docs/scheduling.md, "Per node")."""

from __future__ import annotations

from typing import Any

from wingsmith.domain.admission import Decision
from wingsmith.domain.nodes import nodes_per_worker, pack, pods, smallest_pod, span

from .test_admission import Fleet, verdict

CAPACITY = "insufficient_capacity"


class Nodes(Fleet):
    """The fleet of test_admission.py, with nodes of given sizes and pods on given nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.quota("p", 10_000)
        self.pods = 0

    def nodes(self, cluster: str, *sizes: int | dict[str, Any]) -> list[Decision]:
        """Nodes n1, n2, … of these sizes, or of these fields (`devices` and the rest)."""
        nodes = [
            {"node_id": f"n{i}", "device_class": "H100"}
            | (size if isinstance(size, dict) else {"devices": size})
            for i, size in enumerate(sizes, 1)
        ]
        return self.nodes_of(cluster, nodes)

    def create(
        self,
        name: str,
        replicas: int,
        per: int,
        *,
        mode: str = "aggregated",
        cluster: str = "east",
        authority: str = "managed",
    ) -> list[Decision]:
        return self.event(
            "DeploymentCreated",
            name,
            cluster_id=cluster,
            project="p",
            device_class="H100",
            workload_id=name,
            serving={"devices_per_replica": per, "mode": mode},
            serving_digest="d1",
            desired_replicas=replicas,
            authority=authority,
        )

    def pod(self, deployment: str, node: str, devices: int) -> tuple[str, list[Decision]]:
        self.pods += 1
        name = f"{deployment}-pod-{self.pods}"
        ids = [f"GPU-{name}-{i}" for i in range(devices)]
        decided = self.event(
            "ReplicaStarted",
            name,
            deployment_id=deployment,
            node_id=node,
            device_ids=ids,
            serving_digest="d1",
        )
        return name, decided

    def observed(self, name: str, *on_nodes: tuple[str, int]) -> None:
        """A deployment the plane did not admit, running pods on these nodes."""
        self.create(name, len(on_nodes), on_nodes[0][1], authority="observed")
        for node, devices in on_nodes:
            self.pod(name, node, devices)


def nodes_evidence(d: Decision) -> dict[str, int]:
    keys = ("pod_devices", "nodes_per_worker", "pods_needed", "pods_fitting", "nodes_fitting")
    return {k: d.evidence[k] for k in (*keys, "largest_node_free") if k in d.evidence}


def test_a_worker_spans_the_fewest_nodes_its_devices_split_evenly_over() -> None:
    assert span(8, 8) == 1
    assert span(12, 8) == 2  # 2 pods of 6
    assert span(16, 6) == 4  # 3 does not divide 16: 4 pods of 4
    assert span(7, 4) == 7  # a prime: one device a node
    assert span(509, 8) is None  # a prime above the 64-node bound fits no split
    assert span(4, 0) is None  # no nodes
    assert nodes_per_worker(12, [4, 8, 4]) == 2  # from the largest node
    assert smallest_pod(509) == 509 and smallest_pod(12) == 1


def test_pods_are_packed_first_fit_largest_first() -> None:
    free = [5, 6, 8]
    assert pack(free, {6: 2, 2: 2}) == 0
    assert free == [1, 0, 2]  # the 6s on n2 and n3, both 2s on n1
    assert pack([4, 4, 4, 4], {8: 1}) == 1
    assert pods(14, 6) == {6: 2, 2: 1}


def test_a_12_device_replica_on_8_device_nodes_needs_two_nodes_with_6_free() -> None:
    fleet = Nodes()
    fleet.nodes("east", 8, 8)
    assert verdict(fleet.create("a", 1, 12)) == [("a", True, 12, None)]


def test_a_12_device_replica_waits_while_only_one_node_has_6_free() -> None:
    fleet = Nodes()
    fleet.nodes("east", 8, 8)
    assert verdict(fleet.create("b", 1, 4)) == [("b", True, 4, None)]
    pod, _ = fleet.pod("b", "n1", 4)
    [pending] = fleet.create("a", 1, 12)  # 12 free in all, but n1 has 4 of them
    assert verdict([pending]) == [("a", False, 0, CAPACITY)]
    assert (pending.evidence["capacity"], pending.evidence["held_in_cluster"]) == (16, 4)
    assert nodes_evidence(pending) == {
        "pod_devices": 6,
        "nodes_per_worker": 2,
        "pods_needed": 2,
        "pods_fitting": 1,
        "nodes_fitting": 1,
        "largest_node_free": 8,
    }
    fleet.event("DeploymentScaled", "b", desired_replicas=0)  # its pod still holds n1
    assert fleet.ledger.deployments["a"].reason == CAPACITY
    assert verdict(fleet.event("ReplicaTerminated", pod)) == [("a", True, 12, None)]


def test_three_nodes_with_4_free_each_hold_no_pod_of_6() -> None:
    fleet = Nodes()
    fleet.nodes("east", 8, 8, 8)
    fleet.observed("o", ("n1", 4), ("n2", 4), ("n3", 4))
    [pending] = fleet.create("a", 1, 12)
    assert verdict([pending]) == [("a", False, 0, CAPACITY)]
    assert nodes_evidence(pending)["nodes_fitting"] == 0
    assert nodes_evidence(pending)["largest_node_free"] == 4


def test_16_free_devices_spread_4_4_4_4_refuse_an_8_device_single_node_worker() -> None:
    fleet = Nodes()
    fleet.nodes("east", 8, 8, 8, 8)
    fleet.observed("o", ("n1", 4), ("n2", 4), ("n3", 4), ("n4", 4))
    [pending] = fleet.create("a", 1, 8)
    assert verdict([pending]) == [("a", False, 0, CAPACITY)]
    assert pending.evidence["capacity"] - pending.evidence["held_in_cluster"] == 16
    assert nodes_evidence(pending) == {
        "pod_devices": 8,
        "nodes_per_worker": 1,
        "pods_needed": 1,
        "pods_fitting": 0,
        "nodes_fitting": 0,
        "largest_node_free": 4,
    }


def test_devices_held_outside_wingsmith_are_not_free_on_their_node() -> None:
    """Pods Wingsmith does not manage hold 5 of n1's 8 devices and 6 of n2's: 5 devices are
    free in sum, but no node has the 4 of a worker."""
    fleet = Nodes()
    fleet.nodes("east", {"devices": 8, "held_outside": 5}, {"devices": 8, "held_outside": 6})
    [pending] = fleet.create("a", 1, 4)
    assert verdict([pending]) == [("a", False, 0, CAPACITY)]
    assert pending.evidence["capacity"] == 5
    assert nodes_evidence(pending) == {
        "pod_devices": 4,
        "nodes_per_worker": 1,
        "pods_needed": 1,
        "pods_fitting": 0,
        "nodes_fitting": 0,
        "largest_node_free": 3,
    }
    # the outside pod on n1 ends: its devices are free again, and a is admitted
    decided = fleet.nodes("east", 8, {"devices": 8, "held_outside": 6})
    assert verdict(decided) == [("a", True, 4, None)]


def test_an_unschedulable_node_takes_nothing_new_and_its_pods_still_count() -> None:
    """n1 is cordoned with a's pod of 4 on it: nothing more goes to n1, and a's pod still
    counts against the cluster until it ends."""
    fleet = Nodes()
    fleet.nodes("east", 8, 8)
    assert verdict(fleet.create("a", 1, 4)) == [("a", True, 4, None)]
    fleet.pod("a", "n1", 4)
    fleet.nodes("east", {"devices": 8, "unschedulable": True}, 8)
    assert verdict(fleet.create("b", 1, 4)) == [("b", True, 4, None)]
    [pending] = fleet.create("c", 1, 4)
    assert verdict([pending]) == [("c", False, 0, CAPACITY)]
    assert (pending.evidence["capacity"], pending.evidence["held_in_cluster"]) == (8, 8)


def test_pod_sizes_follow_the_nodes_devices_not_what_is_free_on_them() -> None:
    """A worker of 8 stays one pod of 8 when outside pods hold devices on every 8-device
    node (it waits), rather than being split into pods that would flap the render."""
    fleet = Nodes()
    fleet.nodes("east", {"devices": 8, "held_outside": 2}, {"devices": 8, "held_outside": 2})
    [pending] = fleet.create("a", 1, 8)
    assert verdict([pending]) == [("a", False, 0, CAPACITY)]
    assert nodes_evidence(pending)["pod_devices"] == 8
    assert nodes_evidence(pending)["largest_node_free"] == 6


def test_grants_not_started_yet_reserve_their_pods_on_whole_nodes() -> None:
    """a's two pods of 6 are reserved on n1 and n2 before they start: b's pod of 6 does not
    fit the 2 + 2 + 4 left, though 8 devices are."""
    fleet = Nodes()
    fleet.nodes("east", 8, 8, 4)
    assert verdict(fleet.create("a", 1, 12)) == [("a", True, 12, None)]
    [pending] = fleet.create("b", 1, 6)
    assert verdict([pending]) == [("b", False, 0, CAPACITY)]
    assert nodes_evidence(pending)["largest_node_free"] == 4


def test_a_pod_started_elsewhere_than_counted_lets_a_waiting_deployment_look_again() -> None:
    """a's pod of 4 was counted on n1 (first fit); it starts on n2 instead (the cluster
    chose), so n1 now has room for b's pod of 8 though no device was released."""
    fleet = Nodes()
    fleet.nodes("east", 8, 4)
    assert verdict(fleet.create("a", 1, 4)) == [("a", True, 4, None)]
    assert verdict(fleet.create("b", 1, 8)) == [("b", False, 0, CAPACITY)]
    _, decided = fleet.pod("a", "n2", 4)
    assert verdict(decided) == [("b", True, 8, None)]


def test_a_disaggregated_replica_of_two_4_device_workers_on_4_device_nodes() -> None:
    fleet = Nodes()
    fleet.nodes("east", 4, 4, 4)
    fleet.observed("o", ("n1", 1), ("n2", 1))
    [pending] = fleet.create("a", 1, 8, mode="disaggregated")  # prefill and decode: 4 each
    assert verdict([pending]) == [("a", False, 0, CAPACITY)]  # 10 free, one node of 4
    assert nodes_evidence(pending) == {
        "pod_devices": 4,
        "nodes_per_worker": 1,
        "pods_needed": 2,
        "pods_fitting": 1,
        "nodes_fitting": 1,
        "largest_node_free": 4,
    }
    fleet.nodes("east", 4, 4, 4, 4)  # a fourth node: two of 4 free
    assert fleet.ledger.deployments["a"].phase == "admitted"


def test_a_disaggregated_workload_placed_by_the_ledger_counts_its_workers_pods() -> None:
    """Two 2-device workers a replica: two replicas are four pods, which a node of 6 and one
    of 2 hold (two 4-device pods would not fit)."""
    fleet = Nodes()
    fleet.nodes("east", 2, 6)
    serving = {"devices_per_replica": 4, "mode": "disaggregated"}
    decided = fleet.event(
        "WorkloadCreated",
        "a",
        project="p",
        device_class="H100",
        serving=serving,
        serving_digest="d1",
        replicas=2,
        cluster_pin=None,
    )
    assert verdict(decided) == [("a--east", True, 8, None)]


def test_a_replica_the_nodes_hold_back_is_granted_when_a_pod_ends_inside_its_grant() -> None:
    fleet = Nodes()
    fleet.nodes("east", 2, 3)
    fleet.create("a", 1, 1)
    pod, _ = fleet.pod("a", "n1", 1)  # n1 has 1 free, n2 3
    fleet.create("b", 1, 2)  # granted, not started: its pod counted on n2
    [held_back] = fleet.create("c", 2, 2)  # the sums allow one replica; no node holds its pod
    assert verdict([held_back]) == [("c", False, 0, CAPACITY)]
    assert held_back.evidence["pods_fitting"] == 0
    # a's pod ends, its grant stands: b's pod now counts on n1, and n2 holds one of c's
    assert verdict(fleet.event("ReplicaTerminated", pod)) == [("c", True, 2, CAPACITY)]


def test_disaggregated_workers_wider_than_a_node_span_several() -> None:
    """Prefill and decode of 8 devices each, on nodes of 4: four pods of 4."""
    fleet = Nodes()
    fleet.nodes("east", 4, 4, 4, 4)
    assert verdict(fleet.create("a", 1, 16, mode="disaggregated")) == [("a", True, 16, None)]
    fleet.nodes("west", 4, 4, 4, 4, 4)
    fleet.create("o", 1, 1, cluster="west", authority="observed")
    fleet.pod("o", "n1", 1)
    fleet.pod("o", "n2", 1)
    [pending] = fleet.create("b", 1, 16, mode="disaggregated", cluster="west")
    assert verdict([pending]) == [("b", False, 0, CAPACITY)]  # 18 free, three nodes of 4
    assert nodes_evidence(pending) == {
        "pod_devices": 4,
        "nodes_per_worker": 2,
        "pods_needed": 4,
        "pods_fitting": 3,
        "nodes_fitting": 3,
        "largest_node_free": 4,
    }


def test_a_worker_that_fits_no_node_says_so_and_holds_back_nobody() -> None:
    fleet = Nodes()
    fleet.nodes("east", *[8] * 64)
    [never] = fleet.create("a", 1, 509)  # a prime above 64: no even split fits a node of 8
    assert verdict([never]) == [("a", False, 0, CAPACITY)]
    assert {k: never.evidence[k] for k in ("worker_devices", "pod_devices", "node_devices")} == {
        "worker_devices": 509,
        "pod_devices": 509,
        "node_devices": 8,
    }
    assert verdict(fleet.create("b", 1, 8)) == [("b", True, 8, None)]


def test_pods_that_could_not_fit_even_an_empty_cluster_hold_back_nobody() -> None:
    fleet = Nodes()
    fleet.nodes("east", 8, 8, 4, 4)  # 24 devices; pods of 6 fit only the two nodes of 8
    [never] = fleet.create("a", 2, 12)  # four pods of 6: two fit, the other two never will
    assert verdict([never]) == [("a", True, 12, CAPACITY)]
    assert (nodes_evidence(never)["pods_needed"], nodes_evidence(never)["pods_fitting"]) == (4, 2)
    assert verdict(fleet.create("b", 1, 4)) == [("b", True, 4, None)]


def test_a_waiting_multinode_deployment_keeps_its_place_while_it_could_fit() -> None:
    fleet = Nodes()
    fleet.nodes("east", 8, 8)
    fleet.create("b", 1, 4)
    pod, _ = fleet.pod("b", "n1", 4)
    assert verdict(fleet.create("a", 1, 12)) == [("a", False, 0, CAPACITY)]
    [c] = fleet.create("c", 1, 2)  # it would fit, but waits behind a
    assert (verdict([c]), c.evidence["queue_position"]) == ([("c", False, 0, CAPACITY)], 2)
    fleet.event("DeploymentScaled", "b", desired_replicas=0)
    decided = fleet.event("ReplicaTerminated", pod)
    assert verdict(decided) == [("a", True, 12, None), ("c", True, 2, None)]


def workload(fleet: Fleet, name: str, replicas: int, per: int, **serving: Any) -> None:
    fleet.event(
        "WorkloadCreated",
        name,
        project="p",
        device_class="H100",
        serving={"devices_per_replica": per, **serving},
        serving_digest="d1",
        replicas=replicas,
        cluster_pin=None,
        allowed_clusters=None,
    )


def test_placement_counts_room_in_pods_that_fit_the_nodes() -> None:
    """East has more free devices (5 + 5) than west (8), but no node of east holds a pod of
    6: the workload goes west."""
    fleet = Nodes()
    fleet.nodes("east", 8, 8)
    fleet.nodes("west", 8)
    fleet.observed("o", ("n1", 3), ("n2", 3))
    workload(fleet, "llm", 1, 6)
    assert fleet.shares("llm") == {"west": 1}
    assert fleet.ledger.deployments["llm--west"].phase == "admitted"


def test_placement_leaves_out_clusters_whose_nodes_hold_no_pod_of_a_worker() -> None:
    fleet = Nodes()
    fleet.nodes("east", *[8] * 64)
    workload(fleet, "huge", 1, 509)
    [deferred] = fleet.placed
    assert deferred.shares == {}
    assert deferred.message is not None and "a pod needs 509 devices" in deferred.message
    assert deferred.reason == "no_node_holds_a_pod"
