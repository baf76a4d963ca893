"""Placement that moves, over a real nats-server with three simulated clusters: one goes
silent; past its grace period its workloads run elsewhere where room exists (its old
deployments disabled, not deleted; a pinned one stays); when it returns, its operator takes the
old replicas down. And a share waiting for capacity moves, after its delay, to a cluster that
comes with room. Over the whole stored history, nothing is ever over quota, over a cluster's
devices, or over a node's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import Notification
from wingsmith.services.config import Settings
from wingsmith.services.hub.relay import event_type
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import SimNode, simulated_operators

from .conftest import LLAMA, read_store, wait_for
from .test_simulated import (
    command,
    event_types,
    health,
    pinned_workload,
    serving,
    until_event,
    until_status,
    view,
)

NODES = {name: [SimNode(f"{name}-n1", "H100", 4)] for name in ("east", "west", "north")}


def unpinned(workload_id: str, replicas: int) -> dict[str, Any]:
    body = {"workload_id": workload_id, "project": "p", "device_class": "H100"}
    return body | {"serving": LLAMA, "replicas": replicas}


async def test_a_lost_clusters_workloads_run_elsewhere_and_nothing_is_ever_over(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        cluster_silence=1.0,
        cluster_lost_after=1.5,
    )
    east = {"east": NODES["east"]}
    others = {name: NODES[name] for name in ("west", "north")}
    pods = tmp_path / "pods"  # east's pods outlive its operator: the cluster runs on, unheard
    async with running_hub(settings):
        await command(
            client, "q", "project.set_quota", project="p", device_class="H100", devices=16
        )
        async with simulated_operators(client, others, ready_after=0.1, heartbeat_every=0.2):
            async with simulated_operators(
                client, east, ready_after=0.1, heartbeat_every=0.2, state_dir=pods
            ):
                for name in NODES:
                    await until_event(client, "cluster", name, "InventoryReported")
                # the most room first, ties by id: chat goes to east, embed to north
                await command(client, "chat", "workload.create", **unpinned("chat", 3))
                await until_status(client, "chat--east", "chat's 3 replicas ready", serving(3))
                await pinned_workload(client, "pin", workload_id="pin", replicas=1)
                await until_status(
                    client, "pin--east", "the pinned replica ready (east full)", serving(1)
                )
                await command(client, "embed", "workload.create", **unpinned("embed", 2))
                await until_status(client, "embed--north", "embed's 2 ready", serving(2))
            # east's operator is gone: unreachable after the silence, lost after the grace
            await until_event(client, "cluster", "east", "ClusterUnreachable")
            await until_event(client, "workload", "chat", "WorkloadMoved")
            await until_status(client, "chat--west", "chat's 3 replicas on west", serving(3))
            workload = await view(client, "workloads", "chat") or {}

            async def moved() -> bool:
                found = await view(client, "workloads", "chat") or {}
                return bool(found.get("moves"))

            await wait_for(moved, 30, "the move in the workloads view")
            workload = await view(client, "workloads", "chat") or {}
            assert workload["moves"][-1] | {"at": None} == {
                "from_cluster": "east",
                "to_cluster": "west",
                "replicas": 3,
                "reason": "cluster_lost",
                "at": None,
            }
            old = await event_types(client, "deployment", "chat--east")
            assert "DeploymentDisabled" in old and "DeploymentDeleted" not in old
            assert "WorkloadMoved" not in await event_types(client, "workload", "pin")
            assert "WorkloadMoved" not in await event_types(client, "workload", "embed")

            # east returns, its old pods still running: its operator takes chat's down
            async with simulated_operators(
                client, east, ready_after=0.1, heartbeat_every=0.2, state_dir=pods
            ):
                await until_event(client, "cluster", "east", "ClusterReachable")

                async def taken_down() -> bool:
                    status = (await health(client, "chat--east")).get("status") or {}
                    return (status.get("ready_replicas"), status.get("desired_replicas")) == (0, 0)

                await wait_for(taken_down, 30, "chat's old replicas on east taken down")
                await until_status(client, "pin--east", "the pinned one still runs", serving(1))
                await until_status(client, "chat--west", "chat still on west", serving(3))
    history = History(read_store(tmp_path / "hub"))
    history.check()
    on = {deployment for deployment, _, _ in history.replicas.values()}
    assert "chat--east" not in on and "pin--east" in on  # the old ones terminated; not the pin


@dataclass
class History:
    """The stored history, folded one event at a time, checking at every point that no
    project holds more than its quota, and no cluster or node more than it has."""

    notes: list[Notification]
    quota: dict[str, int] = field(default_factory=dict)
    nodes: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, node) -> devices
    deployments: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (cluster, project)
    granted: dict[str, int] = field(default_factory=dict)
    replicas: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # -> (dep, node, n)

    def check(self) -> None:
        for position, note in enumerate(self.notes, 1):
            self.fold(event_type(note.topic), str(note.originator_id), orjson.loads(note.state))
            self.nothing_over(position)
        assert self.granted and self.replicas is not None  # something was decided and ran

    def fold(self, kind: str, originator: str, e: dict[str, Any]) -> None:
        key = originator.partition(":")[2]
        if kind == "QuotaSet":
            self.quota[key] = e["devices"]
        elif kind == "InventoryReported":
            for node in e["nodes"]:
                self.nodes[(key, node["node_id"])] = node["devices"]
        elif kind == "DeploymentCreated":
            self.deployments[key] = (e["cluster_id"], e["project"])
        elif kind == "AdmissionDecided":
            self.granted[key] = e.get("devices", 0)
        elif kind == "ReplicaStarted":
            self.replicas[key] = (e["deployment_id"], e["node_id"], len(e["device_ids"]))
        elif kind == "ReplicaTerminated":
            self.replicas.pop(key, None)

    def nothing_over(self, position: int) -> None:
        allocated: dict[str, int] = {}
        on_node: dict[tuple[str, str], int] = {}
        for deployment_id, node, devices in self.replicas.values():
            allocated[deployment_id] = allocated.get(deployment_id, 0) + devices
            where = (self.deployments[deployment_id][0], node)
            on_node[where] = on_node.get(where, 0) + devices
        for where, devices in on_node.items():
            assert devices <= self.nodes[where], (position, where, devices)
        by_project: dict[str, int] = {}
        in_cluster: dict[str, int] = {}
        for deployment_id, (cluster_id, project) in self.deployments.items():
            held = max(self.granted.get(deployment_id, 0), allocated.get(deployment_id, 0))
            by_project[project] = by_project.get(project, 0) + held
            in_cluster[cluster_id] = in_cluster.get(cluster_id, 0) + held
        for project, held in by_project.items():
            assert held <= self.quota.get(project, 0), (position, project, held)
        for cluster_id, held in in_cluster.items():
            total = sum(d for (c, _), d in self.nodes.items() if c == cluster_id)
            assert held <= total, (position, cluster_id, held, total)


async def test_a_share_waiting_for_capacity_moves_when_another_cluster_has_room(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        placement_move_after=1.0,
    )
    east = {"east": [SimNode("east-n1", "H100", 2)]}
    west = {"west": [SimNode("west-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=8)
        async with simulated_operators(client, east, ready_after=0.1, heartbeat_every=0.2):
            await until_event(client, "cluster", "east", "InventoryReported")
            await command(client, "chat", "workload.create", **unpinned("chat", 4))
            await until_status(client, "chat--east", "the 2 that fit ready", serving(2))
            view_east = await health(client, "chat--east")
            assert view_east["admission"]["reason"] == "insufficient_capacity"
            async with simulated_operators(client, west, ready_after=0.1, heartbeat_every=0.2):
                await until_event(client, "workload", "chat", "WorkloadMoved")
                await until_status(client, "chat--west", "2 moved to west", serving(2))
                await until_status(client, "chat--east", "2 still on east", serving(2))

                async def settled() -> bool:
                    workload = await view(client, "workloads", "chat") or {}
                    reasons = [m["reason"] for m in workload.get("moves", ())]
                    east_now = await health(client, "chat--east")
                    return reasons == ["pending_too_long"] and east_now["waiting_replicas"] == 0

                await wait_for(settled, 30, "one move, and nothing waiting on east")
    History(read_store(tmp_path / "hub")).check()
