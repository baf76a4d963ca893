"""The whole reconciliation loop over a real nats-server, on SQLite and on PostgreSQL: three
simulated clusters, two projects with quotas, placement, admission, a capacity-starved cluster,
scaling and a rollout, checked against the event history each deployment ends up with."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import (
    SimNode,
    SimulatedCluster,
    simulated_operators,
)

from .conftest import LLAMA, send_until_answered, wait_for

CLUSTERS = {"east": 8, "west": 4, "north": 2}  # H100 devices on one node each
PHASES = {
    "DeploymentCreated",
    "DeploymentScaled",
    "ServingConfigChanged",
    "AdmissionDecided",
    "DeploymentPlaced",
    "DeploymentRunning",
    "DeploymentFailed",
}


class Fleet:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.sent = 0

    async def command(self, verb: str, **body: Any) -> dict[str, Any]:
        self.sent += 1
        reply = await send_until_answered(self.nc, verb, {"command_id": f"t{self.sent}"} | body)
        assert reply["ok"], reply
        return dict(reply["result"])

    async def history(self) -> list[dict[str, Any]]:
        stream = nats_bus.read_stream(self.nc, names.EVENTS_STREAM, "wingsmith.evt.>", follow=False)
        return [orjson.loads(m.data) async for m in stream]

    async def deployment(self, deployment_id: str) -> list[tuple[Any, ...]]:
        """Its admission story: (event type, phase, reason, devices) or (type, detail)."""
        story: list[tuple[Any, ...]] = []
        for e in await self.history():
            if e["aggregate_id"] != deployment_id or e["type"] not in PHASES:
                continue
            body = e["event"]
            if e["type"] == "AdmissionDecided":
                story.append(("decided", body["phase"], body["reason"], body["devices"]))
            elif e["type"] == "DeploymentScaled":
                story.append(("scaled", body["desired_replicas"]))
            elif e["type"] == "DeploymentCreated":
                story.append(("created", body["desired_replicas"]))
            else:
                story.append((e["type"].removeprefix("Deployment"),))
        return story

    async def settle(self, deployment_id: str, last: tuple[Any, ...], what: str) -> None:
        story: list[tuple[Any, ...]] = []

        async def reached() -> bool:
            story[:] = await self.deployment(deployment_id)
            return bool(story) and story[-1] == last

        try:
            await wait_for(reached, 60, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; {deployment_id} went {story}") from None

    async def live_digests(self, deployment_id: str) -> dict[str, int]:
        digests: dict[str, int] = {}
        for e in await self.history():
            if e["aggregate_id"] == deployment_id and e["type"] == "LiveDigestsObserved":
                digests = e["event"]["live_digests"]
        return digests


def simulated(nc: Client) -> contextlib.AbstractAsyncContextManager[dict[str, SimulatedCluster]]:
    nodes = {name: [SimNode(f"{name}-n1", "H100", devices)] for name, devices in CLUSTERS.items()}
    return simulated_operators(nc, nodes, ready_after=0.15)


async def test_three_clusters_two_projects_placement_admission_and_a_rollout(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, store_url: str
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=store_url, data_dir=tmp_path / "hub")
    fleet = Fleet(client)
    async with running_hub(settings):
        await fleet.command(
            "project.set_quota", project="research", device_class="H100", devices=10
        )
        await fleet.command("project.set_quota", project="product", device_class="H100", devices=6)
        for name in CLUSTERS:
            await fleet.command("cluster.register", cluster_id=name)
        async with simulated(client):

            async def inventories() -> bool:
                reported = [e for e in await fleet.history() if e["type"] == "InventoryReported"]
                return len(reported) == len(CLUSTERS)

            await wait_for(inventories, 30, "every cluster's inventory")
            await scenario(fleet)
    await check_safety(fleet)


async def scenario(fleet: Fleet) -> None:
    workload = {"project": "research", "device_class": "H100", "serving": LLAMA}

    # 1. an unpinned workload goes where there is most room, and runs there
    await fleet.command("workload.create", workload_id="chat", replicas=6, **workload)
    await fleet.settle("chat--east", ("Running",), "chat running on east")
    assert await fleet.deployment("chat--east") == [
        ("created", 6),
        ("decided", "admitted", None, 6),
        ("Placed",),
        ("Running",),
    ]

    # 2. a workload pinned to a cluster too small for it runs what fits there; the rest waits
    # for capacity
    product = workload | {"project": "product"}
    await fleet.command(
        "workload.create", workload_id="embed", replicas=4, cluster="north", **product
    )
    await fleet.settle("embed--north", ("Running",), "embed running in part")
    assert await fleet.deployment("embed--north") == [
        ("created", 4),
        ("decided", "admitted", "insufficient_capacity", 2),
        ("Placed",),
        ("Running",),
    ]

    # 3. the next one goes where the room is: west (north's devices are held by embed)
    await fleet.command("workload.create", workload_id="rerank", replicas=2, **product)
    await fleet.settle("rerank--west", ("Running",), "rerank running on west")

    # 4. scaling fills the cluster chat is on, then spills over; only changed shares move
    await fleet.command("workload.scale", workload_id="chat", replicas=9)
    await fleet.settle("chat--west", ("Running",), "chat running on west too")
    assert (await fleet.deployment("chat--east"))[-2:] == [
        ("scaled", 8),
        ("decided", "running", None, 8),
    ]
    assert (await fleet.deployment("chat--west"))[:2] == [
        ("created", 1),
        ("decided", "admitted", None, 1),
    ]

    # 5. a rollout: east is sized for one generation, so the new one waits inside the old
    # grant while the old replicas make room; west has room for both side by side
    new = LLAMA | {"engine_version": "0.10.0"}
    result = await fleet.command("workload.change_serving_config", workload_id="chat", serving=new)
    digest = result["serving_digest"]

    async def converged() -> bool:
        east, west = await fleet.live_digests("chat--east"), await fleet.live_digests("chat--west")
        return east == {digest: 8} and west == {digest: 1}

    await wait_for(converged, 60, "live_digests to converge on the new configuration")
    await fleet.settle("chat--east", ("Running",), "chat running again on east")
    await fleet.settle("chat--west", ("decided", "running", None, 1), "west's grant back to 1")
    assert (await fleet.deployment("chat--east"))[-5:] == [
        ("ServingConfigChanged",),
        ("decided", "pending", "waiting_for_previous_generation", 8),
        ("decided", "admitted", None, 8),
        ("Placed",),
        ("Running",),
    ]
    assert (await fleet.deployment("chat--west"))[-3:] == [
        ("ServingConfigChanged",),
        ("decided", "running", None, 2),  # old + new footprint
        ("decided", "running", None, 1),  # the old replica gone
    ]

    # 6. the starved deployment waits no more once it asks for what its cluster has
    await fleet.command("workload.scale", workload_id="embed", replicas=2)
    await fleet.settle("embed--north", ("decided", "running", None, 2), "embed no longer waiting")
    assert (await fleet.deployment("embed--north"))[-2:] == [
        ("scaled", 2),
        ("decided", "running", None, 2),
    ]


async def check_safety(fleet: Fleet) -> None:
    """At every point of the history, what admission has granted fits every cluster and every
    project's quota."""
    where: dict[str, tuple[str, str]] = {}
    granted: dict[str, int] = {}
    quota: dict[str, int] = {}
    for e in await fleet.history():
        body = e["event"]
        if e["type"] == "QuotaSet":
            quota[e["aggregate_id"]] = body["devices"]
        elif e["type"] == "DeploymentCreated":
            where[e["aggregate_id"]] = (body["cluster_id"], body["project"])
        elif e["type"] == "AdmissionDecided":
            granted[e["aggregate_id"]] = body["devices"]
            cluster, project = where[e["aggregate_id"]]
            in_cluster = sum(g for d, g in granted.items() if where[d][0] == cluster)
            by_project = sum(g for d, g in granted.items() if where[d][1] == project)
            assert in_cluster <= CLUSTERS[cluster], (e, granted)
            assert by_project <= quota[project], (e, granted)
