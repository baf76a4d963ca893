"""Admission in a running hub over a real nats-server: decisions appear as events with their
evidence, and concurrent demand never gets more devices than the cluster or the quota has."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import Hub, running_hub

from .conftest import LLAMA, operator_heard, seed_deployment, send_until_answered, wait_for


async def events(nc: Client) -> list[dict[str, Any]]:
    stream = nats_bus.read_stream(nc, names.EVENTS_STREAM, "wingsmith.evt.>", follow=False)
    return [orjson.loads(m.data) async for m in stream]


async def decisions(nc: Client, deployment_id: str) -> list[dict[str, Any]]:
    return [
        e["event"]
        for e in await events(nc)
        if e["type"] == "AdmissionDecided" and e["aggregate_id"] == deployment_id
    ]


async def inventory(nc: Client, devices: int, command_id: str) -> None:
    body = {
        "command_id": command_id,
        "cluster_id": "east",
        "nodes": [{"node_id": "n1", "device_class": "H100", "devices": devices}],
    }
    assert (await send_until_answered(nc, "cluster.report_inventory", body))["ok"]


def workload_body(i: int, **fields: Any) -> dict[str, Any]:
    """`workload.create` for workload `w<i>` of project research on H100."""
    return {
        "command_id": f"w{i}",
        "workload_id": f"w{i}",
        "project": "research",
        "device_class": "H100",
        "serving": LLAMA,
    } | fields


async def test_pending_for_capacity_then_admitted_when_the_cluster_reports_devices(
    hub: Hub, client: Client
) -> None:
    deployment = await seed_deployment(client)  # quota 8; east has reported no devices

    async def decided(count: int) -> bool:
        return len(await decisions(client, deployment)) >= count

    await wait_for(lambda: decided(1), 20, "the first admission decision")
    [pending] = await decisions(client, deployment)
    assert (pending["phase"], pending["reason"]) == ("pending", "insufficient_capacity")
    assert pending["evidence"]["wanted"] == 2 and pending["evidence"]["capacity"] == 0

    await inventory(client, 8, "inv-8")
    await wait_for(lambda: decided(2), 20, "the admission once east has devices")
    admitted = (await decisions(client, deployment))[-1]
    assert (admitted["phase"], admitted["devices"], admitted["reason"]) == ("admitted", 2, None)
    assert admitted["evidence"]["capacity"] == 8 and admitted["evidence"]["quota"] == 8

    async def rendered() -> dict[str, Any] | None:  # what an operator starting now would get
        subject = f"wingsmith.render.east.{deployment}"
        stream = nats_bus.read_stream(
            client, names.RENDER_STREAM, subject, follow=False, start="last"
        )
        last = [orjson.loads(m.data) async for m in stream]
        return last[-1] if last else None

    await wait_for(rendered, 20, "the render command for the admitted deployment")
    desired = await rendered()
    assert desired is not None
    assert (desired["replicas"], desired["generation"], desired["enabled"]) == (2, 1, True)


async def test_concurrent_demand_never_exceeds_capacity_or_quota(hub: Hub, client: Client) -> None:
    quota = {"command_id": "q", "project": "research", "device_class": "H100", "devices": 7}
    assert (await send_until_answered(client, "project.set_quota", quota))["ok"]
    register = {"command_id": "c", "cluster_id": "east"}
    assert (await send_until_answered(client, "cluster.register", register))["ok"]
    await inventory(client, 6, "inv-6")

    def workload(i: int) -> dict[str, Any]:
        return workload_body(i, replicas=1 + i % 2, cluster="east")

    changes = [send_until_answered(client, "workload.create", workload(i)) for i in range(24)]
    changes += [inventory(client, 4, "inv-4"), inventory(client, 9, "inv-9")]
    await asyncio.gather(*changes)

    async def settled() -> bool:
        history = await events(client)
        created = sum(e["type"] == "DeploymentCreated" for e in history)
        decided = {e["aggregate_id"] for e in history if e["type"] == "AdmissionDecided"}
        return created == 24 and len(decided) == 24

    await wait_for(settled, 30, "a decision for every deployment")
    await asyncio.sleep(1)  # decisions that follow the last inventory report
    total = 0
    granted: dict[str, Any] = {}
    for e in await events(client):  # at every point of the history
        if e["type"] == "InventoryReported":
            total = sum(n["devices"] for n in e["event"]["nodes"])
        elif e["type"] == "AdmissionDecided":
            grew = e["event"]["devices"] > granted.get(e["aggregate_id"], 0)
            granted[e["aggregate_id"]] = e["event"]["devices"]
            if grew:
                assert sum(granted.values()) <= min(total, 7), (e, granted)
    assert sum(granted.values()) == 7  # the quota, all of it: no room left unused


async def test_after_a_restart_admission_catches_up_from_the_store_and_decides_once(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    data_dir = tmp_path / "hub"
    quiet = Settings(nats_url=nats_server.url, store_url=None, data_dir=data_dir, admission=False)
    async with running_hub(quiet):  # commands only: the deployment waits undecided
        deployment = await seed_deployment(client)
        await inventory(client, 8, "inv-8")
    deciding = dataclasses.replace(quiet, admission=True)
    for _ in range(2):  # the first start decides from the store; the second has nothing to add
        async with running_hub(deciding) as hub:

            async def admitted() -> bool:
                return [d["phase"] for d in await decisions(client, deployment)] == ["admitted"]

            await wait_for(admitted, 20, "the admission decided from the store")
            await asyncio.sleep(1)
            assert hub.relay is not None and hub.relay.synced.is_set()
    assert [d["devices"] for d in await decisions(client, deployment)] == [2]


async def test_concurrent_placement_never_exceeds_any_cluster_or_the_quota(
    hub: Hub, client: Client
) -> None:
    totals = {"east": 6, "west": 5}
    quota = {"command_id": "q", "project": "research", "device_class": "H100", "devices": 9}
    assert (await send_until_answered(client, "project.set_quota", quota))["ok"]
    for name, devices in totals.items():
        register = {"command_id": f"c-{name}", "cluster_id": name}
        assert (await send_until_answered(client, "cluster.register", register))["ok"]
        nodes = [{"node_id": f"{name}-n1", "device_class": "H100", "devices": devices}]
        report = {"command_id": f"inv-{name}", "cluster_id": name, "nodes": nodes}
        assert (await send_until_answered(client, "cluster.report_inventory", report))["ok"]
        await operator_heard(client, name)

    def workload(i: int) -> dict[str, Any]:  # unpinned: placement chooses
        return workload_body(i, replicas=1 + i % 3)

    creates = [send_until_answered(client, "workload.create", workload(i)) for i in range(16)]
    scales = [
        send_until_answered(
            client, "workload.scale", {"command_id": f"s{i}", "workload_id": f"w{i}", "replicas": 4}
        )
        for i in range(0, 16, 5)
    ]
    assert all(r["ok"] for r in await asyncio.gather(*creates))
    assert all(r["ok"] for r in await asyncio.gather(*scales))

    async def placed() -> bool:
        history = await events(client)
        shares: dict[str, int] = {}
        for e in history:
            if e["type"] in ("DeploymentCreated", "DeploymentScaled"):
                shares[e["aggregate_id"]] = e["event"]["desired_replicas"]
        wanted = {f"w{i}": 4 if i % 5 == 0 else 1 + i % 3 for i in range(16)}
        per_workload = {
            w: sum(n for d, n in shares.items() if d.startswith(f"{w}--")) for w in wanted
        }
        return per_workload == wanted

    await wait_for(placed, 30, "every workload's shares to add up to its replicas")
    await asyncio.sleep(1)  # the admissions that follow the last placement
    where: dict[str, str] = {}
    granted: dict[str, int] = {}
    for e in await events(client):  # at every point of the history
        if e["type"] == "DeploymentCreated":
            where[e["aggregate_id"]] = e["event"]["cluster_id"]
        elif e["type"] == "AdmissionDecided":
            granted[e["aggregate_id"]] = e["event"]["devices"]
            for name, total in totals.items():
                assert sum(g for d, g in granted.items() if where[d] == name) <= total, e
            assert sum(granted.values()) <= 9, e
    assert sum(granted.values()) == 9  # the quota, all of it: no room left unused
