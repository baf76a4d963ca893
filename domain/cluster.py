"""A cluster and its inventory: nodes, devices per class and topology domains."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from wingsmith.domain.base import (
    Aggregate,
    Cause,
    Created,
    Event,
    InvalidValue,
    Writer,
    require_writer,
)
from wingsmith.domain.values import (
    MAX_DEVICES_PER_NODE,
    DeviceClass,
    DeviceId,
    Frozen,
    LabelValue,
    NodeName,
    Token,
    once_each,
)


class Node(Frozen):
    """A node as its cluster reports it: `devices` is its allocatable count, and the ids of
    those devices, when the cluster knows them, are listed once each. An `unschedulable` node
    (cordoned, or not Ready) takes no new pods; `held_outside` of its devices are held by pods
    Wingsmith does not manage (a discovered model not adopted, anyone else's job). Neither is
    free for admission; `usable` is what is."""

    node_id: NodeName
    device_class: DeviceClass
    devices: int = Field(ge=0, le=MAX_DEVICES_PER_NODE)
    device_ids: tuple[DeviceId, ...] = Field(default=(), max_length=MAX_DEVICES_PER_NODE)
    topology_domain: LabelValue | None = None
    unschedulable: bool = False
    held_outside: int = Field(default=0, ge=0, le=MAX_DEVICES_PER_NODE)

    @model_serializer(mode="wrap")
    def _news_only_when_said(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Written without `unschedulable` and `held_outside` while they say nothing: stored
        inventories keep the form they had before these fields were added (and within the
        event stream's message size), and an older hub reads the reports."""
        data: dict[str, Any] = handler(self)
        for quiet in ("unschedulable", "held_outside"):
            if not data.get(quiet, True):
                del data[quiet]
        return data

    @property
    def usable(self) -> int:
        """The devices Wingsmith may place new pods on."""
        return 0 if self.unschedulable else self.devices - self.held_outside

    @field_validator("device_ids")
    @classmethod
    def _its_devices(cls, ids: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        once_each(ids)
        devices = info.data.get("devices")
        if devices is not None and len(ids) > devices:
            raise ValueError(f"{len(ids)} device ids for {devices} devices")
        return ids

    @field_validator("held_outside")
    @classmethod
    def _within_its_devices(cls, held: int, info: ValidationInfo) -> int:
        devices = info.data.get("devices")
        if devices is not None and held > devices:
            raise ValueError(f"{held} devices held outside Wingsmith of {devices}")
        return held


class OperatorInfo(Frozen):
    """Which operator serves a cluster: each start picks a new instance id."""

    instance: Token
    version: Token
    read_only: bool
    simulated: bool = False


class Cluster(Aggregate):
    kind = "cluster"
    region: str | None
    labels: dict[str, str]
    nodes: tuple[Node, ...]
    reachable: bool  # heard from lately; placement only chooses reachable clusters
    operator: OperatorInfo | None  # the operator last heard from, once one has been

    @classmethod
    def register(
        cls, cause: Cause, cluster_id: str, region: str | None, labels: dict[str, str]
    ) -> Cluster:
        return cls._start(ClusterRegistered, cluster_id, cause, region=region, labels=labels)

    def report_inventory(self, cause: Cause, nodes: tuple[Node, ...]) -> None:
        ordered = tuple(sorted(nodes, key=lambda n: n.node_id))
        if ordered != self.nodes:
            self._record(InventoryReported, cause, nodes=ordered)

    def hear_operator(self, cause: Cause, operator: OperatorInfo) -> None:
        """An operator's heartbeat: a new operator (or one restarted, or switched to read-only)
        is recorded once; hearing from the cluster makes it reachable again."""
        require_writer(cause, Writer.CLUSTER, "an operator heartbeat")
        if operator != self.operator:
            self._record(OperatorConnected, cause, operator=operator)
        self.set_reachable(cause, True)

    def set_reachable(self, cause: Cause, reachable: bool) -> None:
        if reachable != self.reachable:
            self._record(ClusterReachable if reachable else ClusterUnreachable, cause)

    def devices(self) -> dict[str, int]:
        """Total devices per device class."""
        totals: Counter[str] = Counter()
        for node in self.nodes:
            totals[node.device_class] += node.devices
        return dict(totals)

    def node(self, node_id: str) -> Node | None:
        """The reported node of that name, if any (indexed once per inventory)."""
        index = self.__dict__.get("_node_index")
        if index is None or index[0] is not self.nodes:
            index = (self.nodes, {n.node_id: n for n in self.nodes})
            self.__dict__["_node_index"] = index
        found: Node | None = index[1].get(node_id)
        return found

    def only_device_class(self) -> str:
        """The cluster's one device class, which an adoption defaults to."""
        classes = sorted(self.devices())
        if len(classes) != 1:
            raise InvalidValue(
                f"cluster {self.key!r} has device classes {classes}: give device_class",
                field="device_class",
            )
        return classes[0]

    def check_devices(self, node_id: str, device_ids: Sequence[str]) -> None:
        """A replica holds devices only on a node the cluster reported, no more than that node
        has, and (when the cluster named them) only devices of that node."""
        if not device_ids:
            return
        node = self.node(node_id)
        if node is None:
            raise InvalidValue(
                f"node {node_id!r} is not in the inventory cluster {self.key!r} reported",
                field="node_id",
            )
        if len(device_ids) > node.devices:
            raise InvalidValue(
                f"{len(device_ids)} devices on node {node.node_id!r}, which reported "
                f"{node.devices}",
                field="device_ids",
            )
        unknown = sorted(set(device_ids) - set(node.device_ids)) if node.device_ids else []
        if unknown:
            raise InvalidValue(
                f"device {unknown[0]!r} is not one of node {node.node_id!r}'s reported devices",
                field="device_ids",
            )

    def topology_domains(self) -> set[str]:
        return {n.topology_domain for n in self.nodes if n.topology_domain}


class ClusterRegistered(Created):
    aggregate_class = Cluster
    region: str | None
    labels: dict[str, str]

    def apply(self, cluster: Any) -> None:
        cluster.region = self.region
        cluster.labels = dict(self.labels)
        cluster.nodes = ()
        cluster.reachable = True
        cluster.operator = None


class InventoryReported(Event):
    nodes: tuple[Node, ...]

    def apply(self, cluster: Any) -> None:
        cluster.nodes = self.nodes


class ClusterUnreachable(Event):
    def apply(self, cluster: Any) -> None:
        cluster.reachable = False


class ClusterReachable(Event):
    def apply(self, cluster: Any) -> None:
        cluster.reachable = True


class OperatorConnected(Event):
    operator: OperatorInfo

    def apply(self, cluster: Any) -> None:
        cluster.operator = self.operator
