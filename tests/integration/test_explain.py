"""Explain over a real nats-server, a hub, the REST API and a simulated cluster: a workload
past its quota is explained with the quota's numbers and the quota that would let it all run; a
typo of a device class the fleet reports is refused naming it; a class no cluster has yet is
accepted and explained as such."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from nats.aio.client import Client

from wingsmith.services.hub.wiring import Hub
from wingsmith.services.operator.backends.simulated import SimNode, simulated_operators

from .conftest import LLAMA, send_until_answered, wait_for
from .test_api import api_of
from .test_simulated import command, until_event

LONG = "NVIDIA-H100-80GB-HBM3"


async def explained(http: httpx.AsyncClient, ref: str, reason: str, what: str) -> dict[str, Any]:
    """The explanation of `ref` once its constraint is `reason`."""
    found: dict[str, Any] = {}

    async def says() -> bool:
        nonlocal found
        response = await http.get(f"/v1/deployments/{ref}/explain")
        found = response.json() if response.status_code == 200 else {}
        return (found.get("constraint") or {}).get("reason") == reason

    await wait_for(says, 30, what)
    return found


def workload(workload_id: str, device_class: str, replicas: int, **more: Any) -> dict[str, Any]:
    body = {"workload_id": workload_id, "project": "p", "device_class": device_class}
    return body | {"serving": LLAMA, "replicas": replicas} | more


async def test_explain_says_why_in_numbers_and_a_typo_is_refused_with_did_you_mean(
    hub: Hub, client: Client, tmp_path: Path
) -> None:
    await command(client, "q2", "project.set_quota", project="p", device_class=LONG, devices=2)
    nodes = {"east": [SimNode("east-n1", LONG, 8)]}
    async with (
        simulated_operators(client, nodes, ready_after=0.1),
        api_of(hub, tmp_path) as http,
    ):
        await until_event(client, "cluster", "east", "InventoryReported")

        # a workload past its quota: 2 of 4 granted, the rest waits, explained in numbers
        await command(client, "w", "workload.create", **workload("chat", LONG, 4, cluster="east"))
        e = await explained(http, "chat", "insufficient_quota", "chat explained past quota")
        assert (e["deployment_id"], e["wants"]["replicas"], e["holds"]["replicas"]) == (
            "chat--east",
            4,
            2,
        )
        numbers = e["constraint"]["numbers"]
        assert (numbers["quota"], numbers["free"], numbers["quota_needed"]) == (2, 2, 4)
        assert e["unblock"][0].startswith(f"raise project p's quota for {LONG} to at least 4")

        # a typo of the class the fleet reports: refused, naming it, nothing stored
        typo = workload("typo", "NVIDIA-H100", 1)
        reply = await send_until_answered(client, "workload.create", {"command_id": "t"} | typo)
        assert not reply["ok"]
        error = reply["error"]
        assert (error["code"], error["details"]["field"]) == ("invalid_value", "device_class")
        assert error["details"]["did_you_mean"] == [LONG]
        assert error["details"]["reported"] == [LONG]
        assert (await http.get("/v1/workloads/typo")).status_code == 404

        # a class close to nothing reported: a cluster of it has not joined yet
        await command(client, "f", "workload.create", **workload("fresh", "MI300X", 1))
        e = await explained(
            http, "fresh", "no_cluster_has_device_class", "fresh explained as unplaced"
        )
        assert (e["deployment_id"], e["waiting"]["replicas"]) == (None, 1)
        assert e["constraint"]["reported"] == [LONG]
        assert (await http.get("/v1/workloads/fresh")).json()["unplaced_reason"] == (
            "no_cluster_has_device_class"
        )

        # raising the quota to what explain said lets it all run: nothing waits
        await command(client, "q4", "project.set_quota", project="p", device_class=LONG, devices=4)

        async def nothing_waits() -> bool:
            found = (await http.get("/v1/deployments/chat/explain")).json()
            return found["constraint"] is None and found["waiting"]["replicas"] == 0

        await wait_for(nothing_waits, 30, "chat to hold all it wants")
