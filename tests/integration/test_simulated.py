"""The whole system on simulated clusters, against a real nats-server: an operator that goes
silent makes its cluster unreachable and its deployments stale, and faults injected into a
simulated cluster (node loss, image pulls that fail) move deployments as a real cluster's
would."""

from __future__ import annotations

import asyncio
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
    simulated_operators,
)

from .conftest import LLAMA, read_store, send_until_answered, wait_for


async def command(client: Client, n: str, verb: str, **body: Any) -> dict[str, Any]:
    reply = await send_until_answered(client, verb, {"command_id": n} | body)
    assert reply["ok"], reply
    return dict(reply["result"])


async def event_types(client: Client, aggregate: str, aggregate_id: str) -> list[str]:
    subject = f"wingsmith.evt.{aggregate}.{aggregate_id}.>"
    stream = nats_bus.read_stream(client, names.EVENTS_STREAM, subject, follow=False)
    return [orjson.loads(m.data)["type"] async for m in stream]


async def until_event(
    client: Client, aggregate: str, aggregate_id: str, kind: str, n: int = 1
) -> None:
    async def seen() -> bool:
        return (await event_types(client, aggregate, aggregate_id)).count(kind) >= n

    await wait_for(seen, 30, f"{n} x {kind} on {aggregate} {aggregate_id}")


def pinned(workload_id: str = "chat", replicas: int = 2) -> dict[str, Any]:
    """The body of a workload pinned to `east`."""
    body = {"workload_id": workload_id, "project": "p", "device_class": "H100"}
    return body | {"serving": LLAMA, "replicas": replicas, "cluster": "east"}


async def pinned_workload(
    client: Client, n: str = "w", workload_id: str = "chat", replicas: int = 2
) -> dict[str, Any]:
    """A workload pinned to `east` (the command must succeed)."""
    return await command(client, n, "workload.create", **pinned(workload_id, replicas))


async def view(client: Client, projection: str, key: str) -> dict[str, Any] | None:
    _, latest = (await nats_bus.latest_views(client, projection)).get(key, (0, None))
    return None if latest is None else dict(orjson.loads(latest))


async def health(client: Client, deployment_id: str) -> dict[str, Any]:
    return await view(client, "deployment_health", deployment_id) or {}


async def test_a_silent_operator_makes_its_cluster_unreachable_and_its_deployments_stale(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", cluster_silence=1.5
    )
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.3):
            await until_event(client, "cluster", "east", "OperatorConnected")
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
        # the operator stopped: after the silence the cluster is unreachable
        await until_event(client, "cluster", "east", "ClusterUnreachable")

        async def stale() -> bool:
            view = await health(client, "chat--east")
            return view.get("stale") is True and view.get("status") is not None

        await wait_for(stale, 30, "the deployment to keep its last status, flagged stale")
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.3):
            await until_event(client, "cluster", "east", "ClusterReachable")
            await until_event(client, "cluster", "east", "OperatorConnected", n=2)  # a new start

            async def fresh() -> bool:
                return (await health(client, "chat--east")).get("stale") is False

            await wait_for(fresh, 30, "the deployment to be fresh again")


async def fault(client: Client, cluster_id: str, **body: Any) -> dict[str, Any]:
    reply = await client.request(names.fault_subject(cluster_id), orjson.dumps(body), timeout=5)
    answer: dict[str, Any] = orjson.loads(reply.data)
    return answer


async def test_node_loss_and_failed_image_pulls(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 2), SimNode("east-n2", "H100", 2)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=8)
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.5):
            await until_event(client, "cluster", "east", "InventoryReported")
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")

            assert (await fault(client, "east", fault="node_loss", node="east-n1"))["ok"]
            await until_event(client, "cluster", "east", "InventoryReported", n=2)  # 2 devices
            await until_event(client, "replica", "*", "ReplicaTerminated")
            assert (await fault(client, "east", fault="node_restore", node="east-n1"))["ok"]
            await until_event(client, "cluster", "east", "InventoryReported", n=3)

            refused = await fault(client, "east", fault="node_loss", node="nowhere")
            assert not refused["ok"] and "node" in refused["error"]

            assert (await fault(client, "east", fault="image_pull", deployment_id="chat--east"))[
                "ok"
            ]
            await command(client, "s", "workload.scale", workload_id="chat", replicas=3)
            await until_event(client, "deployment", "chat--east", "DeploymentFailed")


async def test_a_simulated_cluster_keeps_its_pods_across_operator_restarts(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    state = tmp_path / "simulated"
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(
            client, nodes, ready_after=0.1, heartbeat_every=0.3, state_dir=state
        ):
            await until_event(client, "cluster", "east", "OperatorConnected")
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
        async with simulated_operators(
            client, nodes, ready_after=0.1, heartbeat_every=0.3, state_dir=state
        ):
            await until_event(client, "cluster", "east", "OperatorConnected", n=2)
            await command(client, "s", "workload.scale", workload_id="chat", replicas=1)
            await until_event(client, "replica", "*", "ReplicaTerminated")
        started = await event_types(client, "replica", "*")
        assert started.count("ReplicaStarted") == 2  # the same two pods: none started again


async def test_read_only_simulated_operators_observe_and_start_nothing(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """What `wingsmith up --simulated` starts with HANGAR_OPERATOR_READ_ONLY=true: the render
    object arrives, and no pod is started for it."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1, read_only=True) as clusters:
            await until_event(client, "cluster", "east", "OperatorConnected")
            await pinned_workload(client)
            east = clusters["east"]

            async def arrived() -> bool:
                return "chat--east" in east.desired

            await wait_for(arrived, 30, "the render object to reach the read-only cluster")
            await asyncio.sleep(0.5)  # five times what a pod takes to be ready here
            assert east.pods.get("chat--east", {}) == {}
    history = read_store(settings.data_dir)
    connected = [n for n in history if n.topic.endswith("OperatorConnected")]
    assert connected and all(orjson.loads(n.state)["operator"]["read_only"] for n in connected)
