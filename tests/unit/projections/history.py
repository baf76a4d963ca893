"""Random but valid fleet histories, made by the real domain aggregates, as stream envelopes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from wingsmith.domain.base import Aggregate, Cause, DomainError, Event, Writer, split_id
from wingsmith.domain.cluster import Cluster, Node, OperatorInfo
from wingsmith.domain.deployment import (
    AdmissionReason,
    ClusterPhase,
    Deployment,
    DeploymentStatus,
)
from wingsmith.domain.project import Project
from wingsmith.domain.replica import Replica
from wingsmith.domain.values import ServingConfig, stand_in_device_id
from wingsmith.domain.workload import Workload

PLANE = Cause(command_id="c", correlation_id="c", at=datetime(2026, 11, 29, tzinfo=UTC))
CLUSTER = replace(PLANE, writer=Writer.CLUSTER)
CLUSTERS = ("east", "west")
CLASSES = ("H100", "A100")


def serving(devices: int) -> ServingConfig:
    return ServingConfig(
        model="m", backend="vllm", engine_version="1.0", devices_per_replica=devices
    )


class Fleet:
    """Applies operations through the domain, keeping every event in order as an envelope."""

    def __init__(self) -> None:
        self.envelopes: list[dict[str, Any]] = []
        self.workloads: dict[str, Workload] = {}
        self.deployments: dict[str, Deployment] = {}
        self.replicas: dict[str, Replica] = {}
        self.clusters: dict[str, Cluster] = {}
        self.next_device = 0
        # cluster -> node -> its fields; a node of 16 of each class is reported, a spare of 8
        # (`-b`) only once added
        self.nodes: dict[str, dict[str, dict[str, Any]]] = {}
        self.spares: dict[str, dict[str, dict[str, Any]]] = {}
        self.domains: dict[str, str | None] = {}
        for name in CLUSTERS:
            cluster = Cluster.register(PLANE, name, None, {})
            self.clusters[name] = cluster
            self.nodes[name] = {node_id(name, dc): _node(dc, 16) for dc in CLASSES}
            self.spares[name] = {node_id(name, dc, spare=True): _node(dc, 8) for dc in CLASSES}
            self.regroup(name, f"{name}-nvl")
        project = Project.register(PLANE, "p")
        for dc in CLASSES:
            project.set_quota(PLANE, dc, 24)
        self._keep(project)

    def _keep(self, *aggregates: Aggregate) -> None:
        for aggregate in aggregates:
            for event in aggregate.collect_events():
                self.envelopes.append(envelope(event, len(self.envelopes) + 1))

    def run(self, op: tuple[Any, ...]) -> None:
        try:
            getattr(self, op[0])(*op[1:])
        except (DomainError, KeyError, IndexError, ZeroDivisionError):
            aggregates = [*self.workloads.values(), *self.deployments.values()]
            for aggregate in [*aggregates, *self.replicas.values()]:
                aggregate.collect_events()  # a refused operation recorded nothing anyway

    def create(self, i: int, cluster: str, dc: str, replicas: int, per_replica: int) -> None:
        """A deployment of workload `w<i>` on the cluster; the workload is created first if
        it is new (then it serves as it says), and a deleted one takes no more."""
        workload_id = f"w{i}"
        workload = self.workloads.get(workload_id)
        if workload is None:
            workload = self.workloads[workload_id] = Workload.create(
                PLANE,
                workload_id,
                project="p",
                device_class=dc,
                serving=serving(per_replica),
                replicas=replicas,
                cluster_pin=None,
            )
            self._keep(workload)
        if workload.deleted or cluster in workload.deployments:
            return
        d = Deployment.create(
            PLANE,
            workload_id=workload_id,
            cluster_id=cluster,
            project="p",
            device_class=workload.device_class,
            serving=workload.serving,
            desired_replicas=replicas,
        )
        self._keep(d)
        workload.attach_deployment(PLANE, cluster, d.key)
        self._keep(workload)
        self.deployments[d.key] = d

    def _workload(self, i: int) -> Workload:
        return list(self.workloads.values())[i % len(self.workloads)]

    def rescale(self, i: int, n: int) -> None:
        workload = self._workload(i)
        workload.scale(PLANE, n)
        self._keep(workload)

    def defer(self, i: int, message: str) -> None:
        workload = self._workload(i)
        workload.defer_placement(PLANE, message)
        self._keep(workload)

    def delete(self, i: int) -> None:
        """As the hub's handler does: the workload, then each of its deployments."""
        workload = self._workload(i)
        workload.delete(PLANE)
        deployments = [self.deployments[key] for key in workload.deployments.values()]
        for d in deployments:
            d.delete(PLANE)
        self._keep(workload, *deployments)

    def reach(self, cluster: str, reachable: bool) -> None:
        self.clusters[cluster].set_reachable(PLANE, reachable)
        self._keep(self.clusters[cluster])

    def hear(self, cluster: str, instance: str) -> None:
        operator = OperatorInfo(instance=instance, version="1.0", read_only=False)
        self.clusters[cluster].hear_operator(CLUSTER, operator)
        self._keep(self.clusters[cluster])

    def regroup(self, cluster: str, domain: str | None) -> None:
        """Report the cluster's inventory with its nodes in another topology domain."""
        self.domains[cluster] = domain
        self._report(cluster)

    def node(self, cluster: str, dc: str, spare: bool, change: str, held: int) -> None:
        """A node of the cluster is cordoned (or not Ready), made schedulable again, has
        `held` of its devices taken by pods Wingsmith does not manage, is lost from the
        inventory, or is added (back) to it fresh."""
        name = node_id(cluster, dc, spare=spare)
        nodes, spares = self.nodes[cluster], self.spares[cluster]
        if change == "lose" and name in nodes:
            spares[name] = nodes.pop(name)
        elif change == "add" and name in spares:
            nodes[name] = _node(dc, spares.pop(name)["devices"])
        elif name in nodes:
            fields = nodes[name]
            if change in ("cordon", "uncordon"):
                fields["unschedulable"] = change == "cordon"
            elif change == "outside":
                fields["held_outside"] = min(held, fields["devices"])
        self._report(cluster)

    def _report(self, cluster: str) -> None:
        domain = self.domains[cluster]
        nodes = tuple(
            Node(node_id=name, topology_domain=domain, **fields)
            for name, fields in self.nodes[cluster].items()
        )
        self.clusters[cluster].report_inventory(CLUSTER, nodes)
        self._keep(self.clusters[cluster])

    def _deployment(self, i: int) -> Deployment:
        return list(self.deployments.values())[i % len(self.deployments)]

    def admit(self, i: int, admitted: bool) -> None:
        d = self._deployment(i)
        reason = None if admitted else AdmissionReason.INSUFFICIENT_CAPACITY
        devices = d.desired_replicas * d.serving.devices_per_replica if admitted else 0
        d.decide_admission(PLANE, admitted=admitted, reason=reason, evidence={}, devices=devices)
        self._keep(d)

    def place(self, i: int) -> None:
        d = self._deployment(i)
        d.mark_placed(CLUSTER)
        self._keep(d)

    def fail(self, i: int) -> None:
        d = self._deployment(i)
        d.mark_failed(CLUSTER, "CrashLoopBackOff", "exited")
        self._keep(d)

    def status(self, i: int, ready: int) -> None:
        """The cluster's status: `ready` whole replicas, however many pods are ready."""
        d = self._deployment(i)
        phase = ClusterPhase.READY if ready >= d.desired_replicas else ClusterPhase.PROGRESSING
        status = DeploymentStatus(
            phase=phase, ready_replicas=ready, desired_replicas=d.desired_replicas
        )
        d.record_status(CLUSTER, status, version=0)
        self._keep(d)

    def scale(self, i: int, n: int) -> None:
        d = self._deployment(i)
        d.scale(PLANE, n)
        self._keep(d)

    def toggle(self, i: int, on: bool) -> None:
        d = self._deployment(i)
        d.enable(PLANE) if on else d.disable(PLANE)
        self._keep(d)

    def start(self, i: int, spare: bool = False, stand_ins: bool = False) -> None:
        """A replica of a deployment starts on its class's node (or the spare one), holding
        devices the cluster named, or the operator's stand-ins for them."""
        d = self._deployment(i)
        pod, node = f"pod-{len(self.replicas)}", node_id(d.cluster_id, d.device_class, spare)
        devices = tuple(
            stand_in_device_id(node, pod, k) if stand_ins else f"GPU-{self.next_device + k}"
            for k in range(d.serving.devices_per_replica)
        )
        self.next_device += len(devices)
        r = Replica.start(
            CLUSTER,
            deployment_id=d.key,
            name=pod,
            node_id=node,
            device_ids=devices,
            serving_digest=d.serving_digest,
            engine_version="1.0",
        )
        self.replicas[r.key] = r
        self._keep(r)

    def _replica(self, i: int) -> Replica:
        return list(self.replicas.values())[i % len(self.replicas)]

    def ready(self, i: int, ready: bool) -> None:
        r = self._replica(i)
        r.mark_ready(CLUSTER) if ready else r.mark_not_ready(CLUSTER)
        self._keep(r)
        if ready:
            d = self.deployments[r.deployment_id]
            d.mark_running(CLUSTER)
            self._keep(d)

    def terminate(self, i: int) -> None:
        r = self._replica(i)
        r.terminate(CLUSTER)
        self._keep(r)


def node_id(cluster: str, dc: str, spare: bool = False) -> str:
    return f"{cluster}-{dc.lower()}" + ("-b" if spare else "")


def _node(dc: str, devices: int) -> dict[str, Any]:
    return {"device_class": dc, "devices": devices, "unschedulable": False, "held_outside": 0}


def envelope(event: Event, position: int) -> dict[str, Any]:
    kind, key = split_id(event.originator_id)
    data = event.model_dump(mode="json", exclude={"originator_id", "originator_version"})
    return {
        "position": position,
        "aggregate": kind,
        "aggregate_id": key,
        "version": event.originator_version,
        "type": type(event).__name__,
        "event": data,
    }


i = st.integers(0, 50)
CREATE = st.tuples(
    st.just("create"),
    i,
    st.sampled_from(CLUSTERS),
    st.sampled_from(CLASSES),
    st.integers(0, 4),
    st.sampled_from([1, 2, 4]),
)
OPERATIONS = st.one_of(
    CREATE,
    st.tuples(st.just("admit"), i, st.booleans()),
    st.tuples(st.just("place"), i),
    st.tuples(st.just("fail"), i),
    st.tuples(st.just("scale"), i, st.integers(0, 6)),
    st.tuples(st.just("toggle"), i, st.booleans()),
    st.tuples(st.just("start"), i, st.booleans(), st.booleans()),
    st.tuples(st.just("ready"), i, st.booleans()),
    st.tuples(st.just("terminate"), i),
    st.tuples(st.just("regroup"), st.sampled_from(CLUSTERS), st.sampled_from(["a", "b", None])),
    st.tuples(
        st.just("node"),
        st.sampled_from(CLUSTERS),
        st.sampled_from(CLASSES),
        st.booleans(),
        st.sampled_from(["cordon", "uncordon", "outside", "lose", "add"]),
        st.integers(0, 16),
    ),
    st.tuples(st.just("rescale"), i, st.integers(0, 6)),
    st.tuples(st.just("defer"), i, st.sampled_from(["no room", "no cluster"])),
    st.tuples(st.just("delete"), i),
    st.tuples(st.just("reach"), st.sampled_from(CLUSTERS), st.booleans()),
    st.tuples(st.just("hear"), st.sampled_from(CLUSTERS), st.sampled_from(["op-1", "op-2"])),
)


@st.composite
def histories(draw: st.DrawFn) -> Fleet:
    fleet = Fleet()
    for op in draw(st.lists(CREATE, min_size=1, max_size=4)):
        fleet.run(op)
    for op in draw(st.lists(OPERATIONS, min_size=5, max_size=80)):
        fleet.run(op)
    return fleet
