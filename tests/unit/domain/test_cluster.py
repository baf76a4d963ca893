from __future__ import annotations

from wingsmith.domain.cluster import Cluster, Node

from .conftest import plane, recorded

NODES = (
    Node(node_id="n2", device_class="H100", devices=8, topology_domain="rack-b"),
    Node(node_id="n1", device_class="H100", devices=8, topology_domain="rack-a"),
    Node(node_id="n3", device_class="A100", devices=4),
)


def test_inventory_totals_devices_per_class_and_domains() -> None:
    cluster = Cluster.register(plane(), "east", "us-east", {})
    cluster.report_inventory(plane(), NODES)
    assert recorded(cluster) == ["ClusterRegistered", "InventoryReported"]
    assert cluster.devices() == {"H100": 16, "A100": 4}
    assert cluster.topology_domains() == {"rack-a", "rack-b"}


def test_the_same_inventory_in_another_order_records_nothing() -> None:
    cluster = Cluster.register(plane(), "east", None, {})
    cluster.report_inventory(plane(), NODES)
    recorded(cluster)
    cluster.report_inventory(plane(), tuple(reversed(NODES)))
    assert recorded(cluster) == []
