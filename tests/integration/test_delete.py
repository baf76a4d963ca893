"""Deleting a workload on the real stack: a hub and a simulated cluster over a real nats-server.
The delete goes over the command API; the render message becomes a removal, the cluster takes
the pods down, the capacity view gets the devices back, and a workload waiting for them is
admitted into them. The id is not given out again; the name is, to a new incarnation
(test_names.py)."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import SimNode, simulated_operators

from .conftest import send_until_answered, wait_for
from .test_simulated import (
    command,
    event_types,
    pinned,
    pinned_workload,
    until_event,
    view,
)


async def render_of(client: Client, deployment_id: str) -> nats_bus.StreamMessage:
    subject = f"{names.RENDER}.east.{deployment_id}"
    stream = nats_bus.read_stream(client, names.RENDER_STREAM, subject, follow=False)
    [last] = [m async for m in stream]  # the stream keeps the latest per deployment
    return last


async def test_a_deleted_workloads_devices_go_to_the_next_one(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=8)
        async with simulated_operators(
            client, nodes, ready_after=0.1, heartbeat_every=0.3
        ) as simulated:
            await until_event(client, "cluster", "east", "InventoryReported")
            await pinned_workload(client, "w1", "chat", 4)  # asserts it was accepted
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
            await pinned_workload(client, "w2", "embed", 2)  # accepted; no room left: it waits

            async def waiting() -> bool:
                health = await view(client, "deployment_health", "embed--east") or {}
                return health.get("admission", {}).get("reason") == "insufficient_capacity"  # type: ignore[no-any-return]

            await wait_for(waiting, 30, "embed to wait for capacity")

            deleted = await send_until_answered(
                client, "workload.delete", {"command_id": "d1", "workload_id": "chat"}
            )
            assert deleted["ok"] and deleted["result"]["deleted"], deleted

            async def removed() -> bool:
                last = await render_of(client, "chat--east")
                return last.headers.get(nats_bus.DELETED_HEADER) == "true" and last.data == b""

            await wait_for(removed, 30, "the render message to be a removal")

            async def pods_gone() -> bool:
                return not simulated["east"].pods.get("chat--east")

            await wait_for(pods_gone, 30, "the simulated cluster to stop chat's pods")
            await until_event(client, "deployment", "embed--east", "DeploymentRunning")

            async def freed() -> bool:
                row = await view(client, "capacity", "east.H100") or {}
                return (row.get("allocated"), row.get("reserved"), row.get("free")) == (2, 0, 2)

            await wait_for(freed, 30, "capacity to count only embed's 2 devices")

        chat = await event_types(client, "deployment", "chat--east")
        since = set(chat[chat.index("DeploymentDeleted") + 1 :])
        # recorded, no phase: the status, and the operator's deletion on the audit trail
        assert since <= {"StatusObserved", "LiveDigestsObserved", "OperatorActed"}, chat
        replicas = await event_types(client, "replica", "*")
        assert replicas.count("ReplicaTerminated") == 4  # chat's pods, each seen going
        assert await view(client, "workloads", "chat") is None
        assert await view(client, "workload_phase", "chat") is None
        assert await view(client, "deployment_health", "chat--east") is None
        embed = await view(client, "workloads", "embed")
        assert embed is not None and embed["deployments"] == {"east": "embed--east"}

        again = await send_until_answered(
            client, "workload.delete", {"command_id": "d2", "workload_id": "chat"}
        )
        assert again["error"]["code"] == "not_found", again
        reused = await send_until_answered(
            client, "workload.create", {"command_id": "w3"} | pinned("chat", 1)
        )
        assert reused["ok"], reused
        assert (reused["result"]["workload_id"], reused["result"]["name"]) == ("chat--2", "chat")
