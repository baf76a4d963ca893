"""Cluster reports, rule by rule (given / when / then): what an observation is refused for,
and how replica and status reports move a deployment through its phases."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from wingsmith.domain import commands as c
from wingsmith.domain.base import Aggregate, DomainError
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.deployment import AdmissionReason, Authority, Deployment
from wingsmith.domain.replica import Replica
from wingsmith.services.hub.handlers import observe_deployment, observe_replica
from wingsmith.services.hub.ingest import Refused, parse

from ..domain.conftest import cluster, plane, serving


class Repo:
    """The aggregates a handler sees, by kind and key."""

    def __init__(self, *aggregates: Aggregate) -> None:
        self.items: dict[tuple[type[Any], str], Any] = {}
        for a in aggregates:
            self.add(a)

    def get(self, cls: type[Any], key: str) -> Any:
        return self.items.get((cls, key))

    def add(self, aggregate: Aggregate) -> None:
        self.items[(type(aggregate), aggregate.key)] = aggregate

    def reported_device_classes(self) -> set[str]:
        """What the clusters it holds report, as the hub's index would say."""
        clusters = (a for (cls, _), a in self.items.items() if cls is Cluster)
        return {node.device_class for c in clusters for node in c.nodes}


def admitted_deployment() -> Deployment:
    d = Deployment.create(
        plane(),
        workload_id="chat",
        cluster_id="east",
        project="p",
        device_class="H100",
        serving=serving(devices_per_replica=1, parallelism={}),
        desired_replicas=2,
        authority=Authority.MANAGED,
    )
    d.decide_admission(plane(), admitted=True, reason=None, evidence={}, devices=2)
    d.collect_events()
    return d


def east() -> Cluster:
    """The cluster the reports come from, with the node and devices they name."""
    east = Cluster.register(plane(), "east", None, {})
    node = Node(
        node_id="n1", device_class="H100", devices=4, device_ids=tuple(f"GPU-{i}" for i in range(4))
    )
    east.report_inventory(plane(), (node,))
    east.collect_events()
    return east


def replica(state: str, pod: str = "chat-0", **changes: Any) -> c.ObserveReplica:
    body = {
        "command_id": f"obs-{pod}-{state}",
        "cluster_id": "east",
        "deployment_id": "chat--east",
        "pod": pod,
        "node_id": "n1",
        "device_ids": ["GPU-0"],
        "serving_digest": "svg_1",
        "engine_version": "0.9.2",
        "state": state,
    }
    return c.ObserveReplica.model_validate(body | changes)


def status(phase: str, ready: int, **changes: Any) -> c.ObserveDeployment:
    body = {
        "command_id": f"obs-status-{phase}-{ready}",
        "cluster_id": "east",
        "deployment_id": "chat--east",
        "status": {"phase": phase, "ready_replicas": ready, "desired_replicas": 2} | changes,
    }
    return c.ObserveDeployment.model_validate(body)


def types(*aggregates: Aggregate) -> list[str]:
    return [type(e).__name__ for a in aggregates for e in a.collect_events()]


def test_a_replica_holding_devices_places_the_deployment_and_a_ready_one_runs_it() -> None:
    d = admitted_deployment()
    repo = Repo(east(), d)
    observe_replica(repo, replica("started"), cluster())
    assert d.admission_phase.value == "placed"
    observe_replica(repo, replica("ready"), cluster())
    assert d.admission_phase.value == "running"
    r = repo.get(Replica, "chat--east--chat-0")
    assert types(r) == ["ReplicaStarted", "ReplicaReady"]
    assert types(d) == ["DeploymentPlaced", "DeploymentRunning"]


def test_a_ready_report_that_overtakes_the_start_still_makes_sense() -> None:
    d = admitted_deployment()
    repo = Repo(east(), d)
    observe_replica(repo, replica("ready"), cluster())
    assert types(repo.get(Replica, "chat--east--chat-0")) == ["ReplicaStarted", "ReplicaReady"]
    assert types(d) == ["DeploymentPlaced", "DeploymentRunning"]


def test_reports_seen_again_or_late_change_nothing() -> None:
    d = admitted_deployment()
    repo = Repo(east(), d)
    for state in ("started", "ready", "terminated", "ready", "started", "terminated"):
        observe_replica(repo, replica(state), cluster())
    r = repo.get(Replica, "chat--east--chat-0")
    assert types(r) == ["ReplicaStarted", "ReplicaReady", "ReplicaTerminated"]


def test_a_pending_deployment_does_not_move_on_what_its_replicas_do() -> None:
    d = admitted_deployment()
    d.decide_admission(
        plane(),
        admitted=False,
        reason=AdmissionReason.WAITING_FOR_PREVIOUS_GENERATION,
        evidence={},
        devices=2,
    )
    d.collect_events()
    observe_replica(Repo(east(), d), replica("ready"), cluster())
    assert d.admission_phase.value == "pending"


def test_a_failure_the_cluster_reports_fails_the_deployment_with_its_reason() -> None:
    d = admitted_deployment()
    observe_deployment(
        Repo(d), status("failed", 0, reason="ImagePullBackOff", message="no image"), cluster()
    )
    assert d.admission_phase.value == "failed"
    assert types(d) == ["StatusObserved", "DeploymentFailed"]
    assert d.status is not None and d.status.reason == "ImagePullBackOff"


def test_a_running_deployment_with_no_ready_replica_left_is_placed_again() -> None:
    d = admitted_deployment()
    repo = Repo(east(), d)
    observe_replica(repo, replica("ready"), cluster())
    observe_deployment(repo, status("progressing", 0), cluster())
    assert d.admission_phase.value == "placed"
    observe_deployment(repo, status("ready", 2), cluster())
    assert d.admission_phase.value == "running"


def test_a_report_for_a_deployment_on_another_cluster_is_refused() -> None:
    d = admitted_deployment()
    with pytest.raises(DomainError) as refused:
        observe_replica(
            Repo(d, Cluster.register(plane(), "west", None, {})),
            replica("started", cluster_id="west"),
            cluster(),
        )
    assert refused.value.field == "cluster_id"
    assert types(d) == []


@pytest.mark.parametrize(
    ("subject", "body", "problem"),
    [
        ("wingsmith.obs.east.replica", {"cluster_id": "west"}, "is not the subject's cluster"),
        ("wingsmith.obs.east.gossip", {"cluster_id": "east"}, "not an observation subject"),
        ("wingsmith.obs.east.replica", [], "must be a JSON object"),
        ("wingsmith.obs.east.replica", {"cluster_id": "east", "pod": "p"}, "deployment_id"),
        (
            "wingsmith.obs.east.deployment",
            {"cluster_id": "east", "deployment_id": "d", "live_digests": {"x": "many"}},
            "live_digests.x",
        ),
    ],
)
def test_an_observation_is_refused_naming_what_is_wrong(
    subject: str, body: Any, problem: str
) -> None:
    with pytest.raises(Refused, match=problem.replace(".", r"\.")):
        parse(subject, orjson.dumps(body), "m1")


def test_the_message_id_becomes_the_command_id() -> None:
    body = {"cluster_id": "east", "nodes": []}
    command = parse("wingsmith.obs.east.inventory", orjson.dumps(body), "east:inventory:AbC 1")
    assert isinstance(command, c.ReportInventory)
    assert command.command_id == "obs:east:inventory:AbC-1"


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        ({"node_id": "n9"}, "node_id", "node 'n9' is not in the inventory cluster 'east' reported"),
        (
            {"device_ids": [f"GPU-{i}" for i in range(5)]},
            "device_ids",
            "5 devices on node 'n1', which reported 4",
        ),
        ({"device_ids": ["GPU-7"]}, "device_ids", "device 'GPU-7' is not one of node 'n1'"),
    ],
)
def test_a_replica_holds_only_devices_its_cluster_reported(
    changes: dict[str, Any], field: str, problem: str
) -> None:
    d = admitted_deployment()
    repo = Repo(east(), d)
    with pytest.raises(DomainError, match=problem) as refused:
        observe_replica(repo, replica("started", **changes), cluster())
    assert refused.value.field == field
    assert repo.get(Replica, "chat--east--chat-0") is None and types(d) == []


def test_a_replica_on_a_cluster_that_reported_no_inventory_is_refused() -> None:
    d = admitted_deployment()
    repo = Repo(Cluster.register(plane(), "east", None, {}), d)
    with pytest.raises(DomainError, match="not in the inventory cluster 'east' reported"):
        observe_replica(repo, replica("started"), cluster())


def test_a_replica_without_devices_needs_no_reported_node() -> None:
    d = admitted_deployment()
    repo = Repo(east(), d)
    observe_replica(repo, replica("started", node_id="cpu-node", device_ids=[]), cluster())
    assert types(repo.get(Replica, "chat--east--chat-0")) == ["ReplicaStarted"]


def test_node_ids_are_not_needed_when_the_cluster_did_not_name_its_devices() -> None:
    east_ = Cluster.register(plane(), "east", None, {})
    east_.report_inventory(plane(), (Node(node_id="n1", device_class="H100", devices=2),))
    d = admitted_deployment()
    repo = Repo(east_, d)
    observe_replica(repo, replica("started", device_ids=["any-1", "any-2"]), cluster())
    assert d.admission_phase.value == "placed"
