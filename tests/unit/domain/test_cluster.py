from __future__ import annotations

import pytest

from wingsmith.domain.base import InvalidValue
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


def test_an_adoption_defaults_to_the_clusters_one_device_class() -> None:
    cluster = Cluster.register(plane(), "east", "us-east", {})
    cluster.report_inventory(plane(), NODES[:2])
    assert cluster.only_device_class() == "H100"
    cluster.report_inventory(plane(), NODES)
    with pytest.raises(InvalidValue) as two:
        cluster.only_device_class()
    assert two.value.field == "device_class" and "['A100', 'H100']" in str(two.value)


@pytest.mark.parametrize(
    ("node_id", "device_ids", "field"),
    [
        ("n9", ("GPU-a",), "node_id"),  # not in the inventory
        ("n3", ("GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"), "device_ids"),  # more than it has
        ("n4", ("GPU-z",), "device_ids"),  # not one of the devices the node named
    ],
)
def test_a_replica_holds_only_devices_its_cluster_reported(
    node_id: str, device_ids: tuple[str, ...], field: str
) -> None:
    cluster = Cluster.register(plane(), "east", "us-east", {})
    named = Node(node_id="n4", device_class="A100", devices=2, device_ids=("GPU-a", "GPU-b"))
    cluster.report_inventory(plane(), (*NODES, named))
    cluster.check_devices("n4", ("GPU-b",))
    cluster.check_devices("n9", ())  # holding nothing needs no node
    with pytest.raises(InvalidValue) as refused:
        cluster.check_devices(node_id, device_ids)
    assert refused.value.field == field
