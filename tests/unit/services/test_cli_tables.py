"""What the resource commands print: capacity, per node and quota use tables with every
column admission counts, and workloads by name with a later incarnation marked."""

from __future__ import annotations

from typing import Any

from wingsmith.services.cli.client import (
    _cluster_table,
    _node_table,
    _project_table,
    _workload_table,
)

CAPACITY = ["CLASS", "TOTAL", "UNSCHED", "OUTSIDE", "ALLOCATED", "RESERVED", "FREE"]


def cells(printed: str) -> list[list[str]]:
    return [line.split() for line in printed.splitlines()]


def test_clusters_list_shows_what_makes_free_capacity() -> None:
    row = {
        "cluster_id": "east",
        "device_class": "H100",
        "total": 16,
        "unschedulable": 8,
        "held_outside": 2,
        "allocated": 8,
        "reserved": 4,
        "free": -6,
    }
    cluster: Any = {
        "cluster_id": "east",
        "reachable": True,
        "operator": None,
        "nodes": 2,
        "capacity": [row],
    }
    bare = cluster | {"cluster_id": "west", "capacity": []}
    assert cells(_cluster_table({"clusters": [cluster, bare]})) == [
        ["CLUSTER", "REACHABLE", "OPERATOR", "NODES", *CAPACITY],
        ["east", "yes", "-", "2", "H100", "16", "8", "2", "8", "4", "-6"],
        ["west", "yes", "-", "2", "-", "-", "-", "-", "-", "-", "-"],
    ]


def test_clusters_nodes_shows_each_node() -> None:
    node: Any = {
        "cluster_id": "east",
        "device_class": "H100",
        "node_id": "gpu-1",
        "devices": 8,
        "unschedulable": True,
        "held_outside": 0,
        "allocated": 4,
        "free": -4,
    }
    assert cells(_node_table({"nodes": [node]})) == [
        ["NODE", "CLASS", "DEVICES", "UNSCHED", "OUTSIDE", "ALLOCATED", "FREE"],
        ["gpu-1", "H100", "8", "yes", "0", "4", "-4"],
    ]


def test_projects_list_shows_grants_not_started_as_used() -> None:
    quota: Any = {
        "project": "p",
        "device_class": "H100",
        "quota": 24,
        "used": 16,
        "allocated": 8,
        "reserved": 8,
        "available": 8,
    }
    assert cells(_project_table({"projects": [{"project": "p", "quotas": [quota]}]})) == [
        ["PROJECT", "CLASS", "QUOTA", "USED", "ALLOCATED", "RESERVED", "AVAILABLE"],
        ["p", "H100", "24", "16", "8", "8", "8"],
    ]


def test_workloads_list_marks_a_later_incarnation_of_a_name() -> None:
    placed = {"cluster_id": "east", "admission_phase": "running", "ready_replicas": 1}
    first: Any = {
        "workload_id": "embed",
        "name": "embed",
        "incarnation": 1,
        "project": "p",
        "device_class": "H100",
        "replicas": 1,
        "phase": "running",
        "deployments": [placed],
        "unplaced": None,
    }
    again = first | {"workload_id": "chat--2", "name": "chat", "incarnation": 2}
    assert cells(_workload_table({"workloads": [again, first]}))[1:] == [
        ["chat", "#2", "p", "H100", "1", "1", "running", "east:running"],
        ["embed", "p", "H100", "1", "1", "running", "east:running"],
    ]
