"""A cluster and its inventory: nodes, devices per class and topology domains."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import Field

from domain.base import Aggregate, Cause, Created, Event
from domain.values import DeviceClass, Frozen


class Node(Frozen):
    node_id: str = Field(min_length=1, max_length=253)
    device_class: DeviceClass
    devices: int = Field(ge=0, le=1024)
    device_ids: tuple[str, ...] = ()
    topology_domain: str | None = Field(default=None, max_length=253)


class Cluster(Aggregate):
    kind = "cluster"
    region: str | None
    labels: dict[str, str]
    nodes: tuple[Node, ...]
    reachable: bool  # heard from lately; placement only chooses reachable clusters

    @classmethod
    def register(
        cls, cause: Cause, cluster_id: str, region: str | None, labels: dict[str, str]
    ) -> Cluster:
        return cls._start(ClusterRegistered, cluster_id, cause, region=region, labels=labels)

    def report_inventory(self, cause: Cause, nodes: tuple[Node, ...]) -> None:
        ordered = tuple(sorted(nodes, key=lambda n: n.node_id))
        if ordered != self.nodes:
            self._record(InventoryReported, cause, nodes=ordered)

    def set_reachable(self, cause: Cause, reachable: bool) -> None:
        if reachable != self.reachable:
            self._record(ClusterReachable if reachable else ClusterUnreachable, cause)

    def devices(self) -> dict[str, int]:
        """Total devices per device class."""
        totals: Counter[str] = Counter()
        for node in self.nodes:
            totals[node.device_class] += node.devices
        return dict(totals)

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
